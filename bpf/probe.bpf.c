/* probekit's latency probe: the kernel side of every tool (nfsslower, nfsdist, nfstop, the
 * fs* tools, nfsdtop, nfs-exporter), written once for both loaders.
 *
 * It is not compiled alone. probes/generate.py puts in front of it the generated constants and
 * structs (probes/model.py: `struct event`, the settings) and one loader layer, bpf/bcc.h (bcc
 * compiles the probe at start-up for the points chosen there, every setting a constant) or
 * bpf/core.h (compiled once where the package is built, for every candidate point of a spec,
 * every setting an immediate the loader writes into the chosen programs); after it, one program
 * per attach point end, each a call of one of the bodies at the end of this file.
 *
 * What the layer gives: CFG(setting) and P(point, setting) (the settings of the probe and of
 * one point), the map declarations (MAP_HASH, ...) and operations (MAP_LOOKUP, ...: bcc's
 * rewriter takes map calls only where they stand in the text, so they are never inside another
 * macro here, and bcc's emitter spells them as its methods), the field reads of kernel structs
 * (file_dentry, file_sb, file_ino, dentry_sb, dentry_name_ptr, sb_dev), the thread's system
 * call (current_call), a program's arguments (kprobe_param, kprobe_ret, fentry_arg, fexit_ret)
 * and its declaration (PROGRAM). The generated text comes in two parts: constants before the
 * layer, types (`struct event`, the settings' structs, TP_KEYS) after it.
 */

/* start of one operation on one thread: keyed by (thread, attach point) so that operations
 * nesting on a thread (one traced function inside another) are each timed and counted */
struct start_key {
    u32 tid;
    u32 point;
};

struct start_val {
    u64 ts;
    u64 ptr;      /* struct file * or struct dentry * for the file name, or 0 */
    u64 offset;
    u64 bytes;    /* bytes known at entry (tracepoint field), else 0 */
    u64 fileid;
    u64 dev;      /* the superblock's s_dev (the mount): at entry where CFG(dev_at_entry) or a
                   * tracepoint field has it, else found for printed events only */
};

/* per thread, one slot per attach point (ts 0 = none): found through the task itself,
 * without hashing, bucket locks or a free list (kernel >= 5.11); freed with the task */
struct task_starts {
    struct start_val at[NSLOTS];
};
MAP_TASK_STORAGE(task_starts, struct task_starts);
/* the same where the kernel has no task storage for tracing */
MAP_HASH(starts, struct start_key, struct start_val, SIZE(starts));

/* starts whose end fires in another task (RPC completion in rpciod/kworker): matched on the
 * spec's key fields instead of the thread */
struct async_key {
    u32 point;
    u32 pad;
    u64 k[NKEYS];
};

struct async_val {
    struct start_val s;
    u32 pid;
    u32 tid;      /* the thread that started it: a stuck thread's RPC is found by it */
    u64 cgroup;   /* the starting task's cgroup v2 id: the end runs in another task */
    char comm[COMM_LEN];
    char name[NAME_LEN];  /* from the start event (an RPC's procedure), or empty */
};
MAP_HASH(async_starts, struct async_key, struct async_val, SIZE(async_starts));

/* What the probe could not do, counted (probes.model.COUNTERS): deltas dropped as impossible
 * (end before start, or above MAX_LAT_NS); operations not shown in flight because another
 * thread held their slot; slow events dropped because the ring buffer was full; and from
 * COUNTER_UNTIMED on, per op, operations seen to start or end that could not be timed (the
 * start store refused them: task storage busy on this CPU while another task holds it, a
 * full map). With the runs the kernel skipped itself (a program's recursion_misses), user
 * space accounts for every operation not counted. */
MAP_ARRAY(counters, u64, SIZE(counters));

/* slow events, submitted without a wakeup (a wakeup's irq_work runs inside the program's
 * time): user space reads on a short timer */
MAP_RINGBUF(events, SIZE(events));

/* Operations in flight, readable from user space while they last (a stuck operation never
 * reaches record(): this is how it is seen at all). One slot per thread, chosen by thread id,
 * holding the thread's outermost operation's start itself: that start is stored here instead
 * of in task storage or the hash, so tracking it costs no second store. Operations nested
 * inside it, or of a thread whose slot another thread holds, go to the usual store. Async
 * starts (async_starts) are readable as they are. */
struct inflight_slot {
    struct start_val s;  /* s.ts: start time; 0 = free */
    u32 tid;      /* its process: /proc/TID/status, read only for a stuck thread */
    u16 op;
    u16 point;
    s64 call;     /* the system call it began in (current_call) */
};
MAP_ARRAY(inflight, struct inflight_slot, INFLIGHT_SLOTS);

/* histograms and totals are keyed by mount and cgroup always (0 where the tool keys by
 * neither): one layout for every reader, whichever loader ran */
struct dist_key {
    u32 op;
    u32 slot;
    u32 dev;
    u32 pad;
    u64 cgroup;   /* an admitted cgroup v2 id, or 0: every other cgroup (the overflow series) */
};
/* with cgroup keys allocated as used (FLAGS: room for every key is far more than a fleet's
 * cgroups ever fill), else preallocated (5.10 warns of run-time allocation in tracing programs) */
MAP_HASH_FLAGS(dist, struct dist_key, u64, SIZE(dist), FLAGS(dist));

/* per (op, mount, cgroup): bytes moved and, for the exporter (CFG(want_lat_sum)), the sum of
 * latencies (a Prometheus histogram's _sum), both added under the one lookup */
struct total_key {
    u32 op;
    u32 dev;
    u64 cgroup;
};
struct op_total {
    u64 bytes;
    u64 lat_ns;
};
MAP_HASH_FLAGS(op_totals, struct total_key, struct op_total, SIZE(op_totals), FLAGS(op_totals));
/* the cgroups that get series of their own: the first SIZE(cgroup_ids) seen (user space
 * deletes the ones gone), so the label set stays bounded however many units come and go */
MAP_HASH(cgroup_ids, u64, u8, SIZE(cgroup_ids));

struct top_key {
    u32 tgid;
    u32 op;
    u32 dev;      /* the mount with CFG(want_dev) (nfstop --by mount), else 0 */
    u32 pad;
};
struct top_hist_key {
    u32 tgid;
    u32 op;
    u32 slot;
    u32 dev;
};
struct top_val {
    u64 count;
    u64 lat_ns;
    u64 bytes;
    u64 cgroup;           /* cgroup v2 id of its first operation (nfstop --by cgroup) */
    char comm[COMM_LEN];  /* the process may be gone when user space reads the map */
};
MAP_HASH(top_stats, struct top_key, struct top_val, SIZE(top_stats));
MAP_HASH(top_hist, struct top_hist_key, u64, SIZE(top_hist));

/* An NFS server's requests (nfsdtop): a request is timed on its nfsd thread from the
 * dispatch of the decoded call to the encoded reply, and counted per (client address,
 * procedure, export). The reads and writes timed inside it add their bytes to it. */
struct server_key {
    u32 family;   /* AF_INET or AF_INET6 (0: an address the probe cannot read) */
    u32 prog;     /* the RPC program (100003 NFS, 100227 NFSACL) and its version, 0 if unknown */
    u32 vers;
    u32 pad;
    u8 addr[16];  /* IPv4: the first 4 bytes */
    char proc[PROC_LEN];
    u64 exp_ino;  /* the export of the request's file handle: its root's inode and */
    u32 exp_dev;  /* superblock dev (both 0: no file handle verified, e.g. NULL) */
    u32 pad2;
};
/* a request in progress, by thread: user space reads it for the in-progress columns */
struct server_request {
    u64 ts;
    u64 rd_bytes;
    u64 wr_bytes;
    u64 fh;       /* the file handle fh_verify is verifying now (its export is set on return) */
    u64 op_ts;    /* NFSv4: the end of the COMPOUND's previous operation (0: none yet) */
    u64 op_rd;    /* rd_bytes and wr_bytes then: the next operation's bytes are the difference */
    u64 op_wr;
    struct server_key k;
};
MAP_HASH(requests, u32, struct server_request, SIZE(requests));
struct server_val {
    u64 count;
    u64 lat_ns;
    u64 rd_bytes;
    u64 wr_bytes;
};
MAP_HASH(server_stats, struct server_key, struct server_val, SIZE(server_stats));
struct server_hist_key {
    struct server_key k;
    u32 slot;     /* log2 of the service time in microseconds */
    u32 pad;
};
MAP_HASH(server_hist, struct server_hist_key, u64, SIZE(server_hist));

/* [0]: the cgroup v2 directory given by --cgroup (user space stores its fd) */
MAP_CGROUP_ARRAY(cgroup_filter, 1);

static __always_inline void count(u32 which)
{
    u64 *n = MAP_LOOKUP(counters, &which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline u64 read_ptr(u64 addr)
{
    u64 val = 0;
    bpf_probe_read_kernel(&val, sizeof(val), (void *)addr);
    return val;
}

/* one step of an argument source: the member at `off` of the struct at `val`, read (a pointer),
 * or with `addr` its address */
#define STEP(val, addr, off) ((addr) ? (val) + (off) : read_ptr((val) + (off)))

/* point p's argument source i, from the parameter value `param`: up to three steps. Each setting
 * is taken where it is used, so that on CO-RE the verifier drops the steps a point has not, with
 * their settings, and no setting is held across a helper call (bcc's compiler folds them all). */
#define ARG(p, i, param) \
    ({ \
        u64 arg_ = (param); \
        if (P(p, a##i##_n) > 0) \
            arg_ = STEP(arg_, P(p, a##i##_n) == 1 && P(p, a##i##_addr), P(p, a##i##_off0)); \
        if (P(p, a##i##_n) > 1) \
            arg_ = STEP(arg_, P(p, a##i##_n) == 2 && P(p, a##i##_addr), P(p, a##i##_off1)); \
        if (P(p, a##i##_n) > 2) \
            arg_ = STEP(arg_, P(p, a##i##_addr), P(p, a##i##_off2)); \
        arg_; \
    })

/* the histogram slot of v: floor(log2 v) + 1, and 1 for 0 (bcc's bpf_log2l), so that slot k
 * holds [2^(k-1), 2^k - 1]: the readers and the exporter's buckets count on it */
static __always_inline u32 log2_slot(u64 v)
{
    u32 r = 0;
#pragma unroll
    for (int i = 32; i > 0; i >>= 1) {
        if (v >= (1ULL << i)) {
            v >>= i;
            r += i;
        }
    }
    return r + 1;
}

/* a tracepoint field (offset, size, signedness; size 0 = absent) widened to 64 bits */
static __always_inline s64 tp_field(void *ctx, u32 off, u32 size, u32 is_signed)
{
    u64 raw = 0;
    if (size == 0 || size > 8)
        return 0;
    bpf_probe_read_kernel(&raw, size, ctx + off);
    if (is_signed && size < 8 && (raw >> (size * 8 - 1)) & 1)
        raw |= ~0ULL << (size * 8);
    return (s64)raw;
}

/* a tracepoint's __data_loc char[] field (4 bytes: length << 16 | offset): the string's
 * address, or 0 where the point has none */
static __always_inline const char *tp_string(void *ctx, u32 off, u32 size)
{
    u32 loc = 0;
    if (size != 4)
        return 0;
    bpf_probe_read_kernel(&loc, sizeof(loc), ctx + off);
    return (const char *)ctx + (loc & 0xFFFF);
}

/* point p's tracepoint field of role `role` */
#define TPF(p, role) tp_field(ctx, P(p, t_##role##_off), P(p, t_##role##_size), P(p, t_##role##_signed))

/* Functions below that time a point take its number `p` and read its settings where they use
 * them (P(p, id): the point's id as user space numbers it, in map keys and in-flight slots;
 * P(p, slot): its start slot in the thread's task storage; P(p, op)): every caller passes a
 * constant, so on CO-RE each use is an immediate of its own and no setting is held in a
 * register, or spilled, across a helper call. */

/* 1 when the slot took the start (the caller stores nothing else) */
static __always_inline int inflight_start(u64 id, u32 p, struct start_val *v)
{
    u32 idx = (u32)id & (INFLIGHT_SLOTS - 1);
    struct inflight_slot *slot = MAP_LOOKUP(inflight, &idx);
    s64 call = current_call();
    if (!slot)
        return 0;
    if (slot->s.ts) {
        if (slot->tid == (u32)id && slot->point != P(p, id) && slot->call == call)
            return 0;  /* nested inside this thread's outer operation */
        if (slot->tid != (u32)id) {
            count(COUNTER_INFLIGHT_LOST);
            return 0;
        }
    }
    /* free, the same point again, or an operation of an earlier call whose end was missed
     * (the kernel skips a program while its CPU's BPF guard is held) */
    slot->s = *v;
    slot->tid = (u32)id;
    slot->op = P(p, op);
    slot->point = P(p, id);
    slot->call = call;
    return 1;
}

/* 1 when this thread's slot held the start of point p (copied to *out, slot freed) */
static __always_inline int inflight_end(u64 id, u32 p, struct start_val *out)
{
    u32 idx = (u32)id & (INFLIGHT_SLOTS - 1);
    struct inflight_slot *slot = MAP_LOOKUP(inflight, &idx);
    if (!slot || !slot->s.ts || slot->tid != (u32)id || slot->point != P(p, id))
        return 0;
    *out = slot->s;
    slot->s.ts = 0;
    return 1;
}

/* filters, at the start of an operation only: an operation let in is timed to its end */
static __always_inline int want_task(u64 pid_tgid, struct start_val *v)
{
    if (CFG(target_tgid) && (u32)(pid_tgid >> 32) != CFG(target_tgid))
        return 0;
    if (CFG(mount_dev) && (u32)v->dev != CFG(mount_dev))
        return 0;
    if (CFG(cgroup_filter) && MAP_UNDER_CGROUP(cgroup_filter, 0) != 1)  /* 1: in the cgroup's subtree */
        return 0;
    return 1;
}

/* s_dev of the superblock of a struct file * or struct dentry * (0 if unknown): two or three
 * reads, at entry for CFG(dev_at_entry), else only for printed events */
static __always_inline u64 dev_of(u64 ptr, u32 ptr_kind)
{
    u64 sb = 0;
    if (ptr_kind == PTR_FILE)
        sb = file_sb(ptr);
    else if (ptr_kind == PTR_DENTRY)
        sb = dentry_sb(ptr);
    return sb ? sb_dev(sb) : 0;
}

static __always_inline void name_of(char *dst, u64 ptr, u32 ptr_kind)
{
    u64 dentry = 0;
    if (ptr_kind == PTR_FILE)
        dentry = file_dentry(ptr);
    else if (ptr_kind == PTR_DENTRY)
        dentry = ptr;
    u64 name = dentry ? dentry_name_ptr(dentry) : 0;
    if (name)
        bpf_probe_read_kernel_str(dst, NAME_LEN, (void *)name);
}

static __always_inline void task_start(u32 p, struct start_val *v)
{
    u64 id = bpf_get_current_pid_tgid();
    struct task_starts *t;
    if (!want_task(id, v))
        return;
    v->ts = bpf_ktime_get_ns();
    if (CFG(want_inflight) && inflight_start(id, p, v))
        return;
    if (CFG(task_storage)) {
        t = MAP_TASK_STORAGE_GET(task_starts, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
        if (!t || P(p, slot) >= NSLOTS) {
            count(COUNTER_UNTIMED + P(p, op));
            return;
        }
        t->at[P(p, slot)] = *v;
    } else {
        struct start_key k = {.tid = (u32)id, .point = P(p, id)};
        if (MAP_UPDATE(starts, &k, v))
            count(COUNTER_UNTIMED + P(p, op));
    }
}

/* zeroed first: the record goes to user space whole, padding and unused name bytes included */
static __always_inline void fill_event(struct event *e, u32 p, u32 pid, const char *comm, u64 cgroup,
                                       u64 now, u64 delta, struct start_val *s, const char *name)
{
    __builtin_memset(e, 0, sizeof(*e));
    e->end_ns = now;
    e->lat_ns = delta;
    e->bytes = s->bytes;
    e->offset = s->offset;
    e->fileid = s->fileid;
    e->dev = s->dev ? s->dev : (s->ptr ? dev_of(s->ptr, P(p, ptr_kind)) : 0);
    e->cgroup = cgroup;
    /* the inode number (NFS: the fileid) of a file-timed operation: user space names the
     * tracepoint-timed lines of the same inode (fsync, getattr) from it */
    if (!e->fileid && s->ptr && P(p, ptr_kind) == PTR_FILE)
        e->fileid = file_ino(s->ptr);
    e->pid = pid;
    e->op = P(p, op);
    if (comm)
        __builtin_memcpy(e->comm, comm, COMM_LEN);
    else
        bpf_get_current_comm(&e->comm, sizeof(e->comm));
    if (name)
        bpf_probe_read_kernel_str(e->name, NAME_LEN, name);
    else if (s->ptr)
        name_of(e->name, s->ptr, P(p, ptr_kind));
}

/* the cgroup id an admitted series is keyed by: the first SIZE(cgroup_ids) seen, else 0 */
static __always_inline u64 admitted_cgroup(u64 id)
{
    u8 one = 1;
    if (MAP_LOOKUP(cgroup_ids, &id))
        return id;
    /* refused when full; a racing CPU's insert of the same id makes the lookup succeed */
    if (MAP_INSERT(cgroup_ids, &id, &one) == 0 || MAP_LOOKUP(cgroup_ids, &id))
        return id;
    return 0;
}

/* the NFS server request the current nfsd thread is serving, or 0 */
static __always_inline struct server_request *current_request(void)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    return MAP_LOOKUP(requests, &tid);
}

/* the bytes a read or write inside the thread's NFS server request moved */
static __always_inline void server_bytes(u32 p, u64 bytes)
{
    struct server_request *r = current_request();
    if (!r)
        return;
    if (P(p, op) == CFG(op_read))
        r->rd_bytes += bytes;
    else if (P(p, op) == CFG(op_write))
        r->wr_bytes += bytes;
}

/* one finished operation of point p: a sane delta feeds the histograms and, above the
 * threshold, one event (`name`: the file or RPC name where an event field has it, read only for
 * printed events). `comm` and `cgroup` are the starting task's when the end runs in another task
 * (async), else comm is 0 and the current task's are taken. */
static __always_inline void record(void *ctx, u32 p, u32 pid, const char *comm, u64 cgroup, u64 now,
                                   u64 delta, struct start_val *s, const char *name)
{
    u64 task_cgroup = comm ? cgroup : bpf_get_current_cgroup_id();
    if (CFG(want_server))
        server_bytes(p, s->bytes);
    if (CFG(want_dist)) {
        /* the exporter counts in ns: no division (on CO-RE a divisor is a setting, not folded) */
        u64 in_unit = CFG(dist_unit_ns) == 1 ? delta : delta / CFG(dist_unit_ns);
        struct dist_key dk = {.op = P(p, op), .slot = log2_slot(in_unit)};
        struct total_key tk = {.op = P(p, op)};
        struct op_total none = {};
        struct op_total *total;
        u64 zero = 0, *n;
        if (CFG(want_dev)) {
            dk.dev = (u32)s->dev;
            tk.dev = (u32)s->dev;
        }
        if (CFG(want_cgroup_key)) {
            dk.cgroup = admitted_cgroup(task_cgroup);
            tk.cgroup = dk.cgroup;
        }
        n = MAP_LOOKUP(dist, &dk);
        if (!n) {
            MAP_INSERT(dist, &dk, &zero);
            n = MAP_LOOKUP(dist, &dk);
        }
        if (n)
            __sync_fetch_and_add(n, 1);
        else
            count(COUNTER_UNTIMED + P(p, op));  /* a full histogram map: counted, never dropped unseen */
        total = MAP_LOOKUP(op_totals, &tk);
        if (!total) {
            MAP_INSERT(op_totals, &tk, &none);
            total = MAP_LOOKUP(op_totals, &tk);
        }
        if (total) {
            __sync_fetch_and_add(&total->bytes, s->bytes);
            if (CFG(want_lat_sum))
                __sync_fetch_and_add(&total->lat_ns, delta);
        }
    }
    if (CFG(want_top)) {
        struct top_key tk = {.tgid = pid, .op = P(p, op)};
        struct top_hist_key hk = {.tgid = pid, .op = P(p, op), .slot = log2_slot(delta / 1000)};
        struct top_val zero = {};
        struct top_val *tv;
        u64 one = 1, *hn;
        if (CFG(want_dev)) {
            tk.dev = (u32)s->dev;
            hk.dev = (u32)s->dev;
        }
        tv = MAP_LOOKUP(top_stats, &tk);
        if (!tv) {
            MAP_INSERT(top_stats, &tk, &zero);
            tv = MAP_LOOKUP(top_stats, &tk);
        }
        if (tv) {
            if (tv->count == 0) {
                if (comm)
                    __builtin_memcpy(tv->comm, comm, COMM_LEN);
                else
                    bpf_get_current_comm(&tv->comm, sizeof(tv->comm));
                tv->cgroup = task_cgroup;
            }
            __sync_fetch_and_add(&tv->count, 1);
            __sync_fetch_and_add(&tv->lat_ns, delta);
            __sync_fetch_and_add(&tv->bytes, s->bytes);
        }
        hn = MAP_LOOKUP(top_hist, &hk);
        if (hn)
            __sync_fetch_and_add(hn, 1);
        else
            MAP_INSERT(top_hist, &hk, &one);
    }
    if (CFG(want_events) && delta >= CFG(min_lat_ns)) {
        struct event *e = MAP_RINGBUF_RESERVE(events, sizeof(struct event));
        if (!e) {
            count(COUNTER_LOST_EVENTS);
            return;
        }
        fill_event(e, p, pid, comm, task_cgroup, now, delta, s, name);
        MAP_RINGBUF_SUBMIT(events, e, BPF_RB_NO_WAKEUP);
    }
}

/* a delta is only trusted when the end is after the start and below MAX_LAT_NS: a missed
 * entry has no start (nothing is printed), a clock oddity is counted */
static __always_inline int sane_delta(u64 start, u64 now)
{
    if (start == 0 || now < start || now - start > MAX_LAT_NS) {
        count(COUNTER_ANOMALIES);
        return 0;
    }
    return 1;
}

/* end of a same-thread operation; bytes_at_end >= 0 replaces the entry's byte count */
static __always_inline void task_end(void *ctx, u32 p, s64 bytes_at_end, const char *name)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 now = bpf_ktime_get_ns();
    struct start_val s = {};
    int held = 0;
    if (CFG(want_inflight))
        held = inflight_end(id, p, &s);
    if (!held) {
        if (CFG(task_storage)) {
            struct start_val *found;
            /* created if absent: NULL then means busy (counted), not a task that never started */
            struct task_starts *t = MAP_TASK_STORAGE_GET(task_starts, bpf_get_current_task_btf(), 0,
                                                         BPF_LOCAL_STORAGE_GET_F_CREATE);
            if (!t || P(p, slot) >= NSLOTS) {
                count(COUNTER_UNTIMED + P(p, op));
                return;
            }
            found = &t->at[P(p, slot)];
            if (found->ts == 0)
                return;
            s = *found;
            found->ts = 0;
        } else {
            struct start_key k = {.tid = (u32)id, .point = P(p, id)};
            struct start_val *found = MAP_LOOKUP(starts, &k);
            if (!found)
                return;
            s = *found;
            MAP_DELETE(starts, &k);
        }
    }
    if (!sane_delta(s.ts, now))
        return;
    if (bytes_at_end >= 0)
        s.bytes = bytes_at_end;
    record(ctx, p, (u32)(id >> 32), 0, 0, now, now - s.ts, &s, name);
}

static __always_inline void async_start(struct async_key *k, u32 p, struct start_val *s, const char *name)
{
    u64 id = bpf_get_current_pid_tgid();
    struct async_val v = {};
    if (!want_task(id, s))
        return;
    v.s = *s;
    v.s.ts = bpf_ktime_get_ns();
    v.pid = (u32)(id >> 32);
    v.tid = (u32)id;
    v.cgroup = bpf_get_current_cgroup_id();
    bpf_get_current_comm(&v.comm, sizeof(v.comm));
    if (name)
        bpf_probe_read_kernel_str(v.name, NAME_LEN, name);
    if (MAP_UPDATE(async_starts, k, &v))
        count(COUNTER_UNTIMED + P(p, op));
}

/* a watched point's start (P(p, watch): an RPC beneath the operations asked) was tracked in
 * flight only: it leaves the in-flight view, and nothing is recorded */
static __always_inline void async_end(void *ctx, struct async_key *k, u32 p, s64 bytes_at_end)
{
    struct async_val *found;
    struct async_val v;
    u64 now;
    if (P(p, watch)) {
        MAP_DELETE(async_starts, k);
        return;
    }
    found = MAP_LOOKUP(async_starts, k);
    if (!found)
        return;
    now = bpf_ktime_get_ns();
    v = *found;
    MAP_DELETE(async_starts, k);
    if (!sane_delta(v.s.ts, now))
        return;
    if (bytes_at_end >= 0)
        v.s.bytes = bytes_at_end;
    record(ctx, p, v.pid, v.comm, v.cgroup, now, now - v.s.ts, &v.s, v.name[0] ? v.name : 0);
}

/* `addr`: the kernel address of the client's struct sockaddr_storage; `proc`: the procedure's
 * name string; `prog`, `vers`: the addresses of the request's u32 program and version (each 0
 * where unknown) */
static __always_inline void server_start(u64 addr, u64 proc, u64 prog, u64 vers)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct server_request r = {};
    u16 family = 0;
    bpf_probe_read_kernel(&family, sizeof(family), (void *)addr);
    r.k.family = family;
    if (family == 2)        /* AF_INET: struct sockaddr_in's sin_addr */
        bpf_probe_read_kernel(r.k.addr, 4, (void *)(addr + 4));
    else if (family == 10)  /* AF_INET6: struct sockaddr_in6's sin6_addr */
        bpf_probe_read_kernel(r.k.addr, 16, (void *)(addr + 8));
    else
        r.k.family = 0;
    if (proc)
        bpf_probe_read_kernel_str(r.k.proc, PROC_LEN, (void *)proc);
    if (prog)
        bpf_probe_read_kernel(&r.k.prog, sizeof(r.k.prog), (void *)prog);
    if (vers)
        bpf_probe_read_kernel(&r.k.vers, sizeof(r.k.vers), (void *)vers);
    r.ts = bpf_ktime_get_ns();
    if (MAP_UPDATE(requests, &tid, &r))
        count(COUNTER_UNTIMED + (u32)CFG(op_rpc));
}

/* one request's or operation's service: counted, timed and its bytes added under its key
 * (client, export, procedure), and into its log2 histogram; `untimed`, the counter of what
 * found no room in the maps */
static __always_inline void server_record(struct server_hist_key *hk, u64 lat_ns, u64 rd_bytes,
                                          u64 wr_bytes, u32 untimed)
{
    struct server_val zero = {};
    struct server_val *sv = MAP_LOOKUP(server_stats, &hk->k);
    u64 one = 1, *hn;
    if (!sv) {
        MAP_INSERT(server_stats, &hk->k, &zero);
        sv = MAP_LOOKUP(server_stats, &hk->k);
    }
    if (!sv) {
        count(untimed);
        return;
    }
    __sync_fetch_and_add(&sv->count, 1);
    __sync_fetch_and_add(&sv->lat_ns, lat_ns);
    __sync_fetch_and_add(&sv->rd_bytes, rd_bytes);
    __sync_fetch_and_add(&sv->wr_bytes, wr_bytes);
    hk->slot = log2_slot(lat_ns / 1000);
    hn = MAP_LOOKUP(server_hist, hk);
    if (hn)
        __sync_fetch_and_add(hn, 1);
    else
        MAP_INSERT(server_hist, hk, &one);
}

static __always_inline void server_end(void)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct server_request *found = MAP_LOOKUP(requests, &tid);
    struct server_request r;
    struct server_hist_key hk = {};
    u64 now = bpf_ktime_get_ns();
    if (!found)
        return;
    r = *found;
    MAP_DELETE(requests, &tid);
    if (!sane_delta(r.ts, now))
        return;
    hk.k = r.k;
    server_record(&hk, now - r.ts, r.rd_bytes, r.wr_bytes, COUNTER_UNTIMED + (u32)CFG(op_rpc));
}

/* the end of one NFSv4 operation inside the thread's COMPOUND (the kernel's tracepoint after
 * each operation, its reply encoded): counted under the request's client and export with the
 * operation's name (`name`, the kernel's "OP_READ") as procedure, timed from the previous
 * operation's end, the first one from the request's dispatch */
static __always_inline void server_operation(const char *name)
{
    struct server_request *r = current_request();
    struct server_hist_key hk = {};
    u64 now = bpf_ktime_get_ns();
    u64 from, rd_bytes, wr_bytes;
    if (!r || !name)
        return;
    from = r->op_ts ? r->op_ts : r->ts;
    hk.k = r->k;
    __builtin_memset(hk.k.proc, 0, PROC_LEN);
    bpf_probe_read_kernel(hk.k.proc, 3, name);
    /* past the "OP_" of every operation's name ("unknown_operation" kept whole) */
    if (hk.k.proc[0] == 'O' && hk.k.proc[1] == 'P' && hk.k.proc[2] == '_')
        name += 3;
    bpf_probe_read_kernel_str(hk.k.proc, PROC_LEN, name);
    rd_bytes = r->rd_bytes - r->op_rd;
    wr_bytes = r->wr_bytes - r->op_wr;
    r->op_ts = now;
    r->op_rd = r->rd_bytes;
    r->op_wr = r->wr_bytes;
    if (!sane_delta(from, now))
        return;
    server_record(&hk, now - from, rd_bytes, wr_bytes, COUNTER_UNTIMED + (u32)CFG(op_v4op));
}

/* fh_verify's entry: the file handle (struct svc_fh *) it verifies for the thread's request */
static __always_inline void server_fh(u64 fh)
{
    struct server_request *r = current_request();
    if (r)
        r->fh = fh;
}

/* fh_verify's return: the verified handle's export (set by fh_verify), named by its root's
 * inode and superblock dev, read through the context point's argument sources 1 (handle ->
 * export), 2 (export -> root inode number) and 3 (export -> root's s_dev). A COMPOUND that
 * verifies several handles keeps the last one's export (its PUTFH, past the pseudo root's
 * LOOKUPs). */
#define SERVER_EXPORT(p) \
    do { \
        struct server_request *r_ = current_request(); \
        u64 exp_; \
        if (r_ && r_->fh) { \
            exp_ = ARG(p, 1, r_->fh); \
            r_->fh = 0; \
            if (exp_) { \
                r_->k.exp_ino = ARG(p, 2, exp_); \
                r_->k.exp_dev = (u32)ARG(p, 3, exp_); \
            } \
        } \
    } while (0)

/* a kprobe's parameter that point p's setting `name` numbers (the layer's kprobe_param) */
#define kprobe_arg(ctx, p, name) kprobe_param(ctx, P(p, name))

/* The bodies of the generated programs, one per kind of attach point end. `p` is the
 * point's number in the settings; `GET(ctx, p, name)` reads the parameter P(p, name) numbers
 * (kprobe_arg, fentry_arg). */

/* a timed function point's entry: its file or dentry (source 0) and offset (source 1) */
#define TIMED_ENTRY(p, GET) \
    do { \
        struct start_val v_ = {}; \
        if (P(p, a0_param) != NO_PARAM) \
            v_.ptr = ARG(p, 0, GET(ctx, p, a0_param)); \
        if (P(p, a1_param) != NO_PARAM) \
            v_.offset = ARG(p, 1, GET(ctx, p, a1_param)); \
        if (CFG(dev_at_entry) && v_.ptr) \
            v_.dev = dev_of(v_.ptr, P(p, ptr_kind)); \
        task_start(p, &v_); \
    } while (0)

/* a timed function point's end; `ret`: the function's return value */
#define TIMED_EXIT(p, ret) \
    task_end(ctx, p, P(p, ret_bytes) ? ((ret) > 0 ? (ret) : 0) : -1, 0)

/* an NFS server request's entry: the client's address (source 0), the procedure's name (1),
 * the request's RPC program (2) and version (3) */
#define REQUEST_ENTRY(p, GET) \
    server_start(ARG(p, 0, GET(ctx, p, a0_param)), \
                 P(p, a1_param) != NO_PARAM ? ARG(p, 1, GET(ctx, p, a1_param)) : 0, \
                 P(p, a2_param) != NO_PARAM ? ARG(p, 2, GET(ctx, p, a2_param)) : 0, \
                 P(p, a3_param) != NO_PARAM ? ARG(p, 3, GET(ctx, p, a3_param)) : 0)

#define REQUEST_EXIT(p) server_end()

/* a request's context point (fh_verify): the handle (source 0) at entry, its export at return */
#define CONTEXT_ENTRY(p, GET) server_fh(ARG(p, 0, GET(ctx, p, a0_param)))
#define CONTEXT_EXIT(p) SERVER_EXPORT(p)

/* a tracepoint point's start: its fields by role, timed on the thread or (keyed) until the
 * end event with the same key fields */
#define TP_ENTRY(p) \
    do { \
        struct start_val v_ = {}; \
        v_.fileid = TPF(p, fileid); \
        v_.offset = TPF(p, offset); \
        v_.bytes = TPF(p, bytes); \
        v_.dev = TPF(p, dev); \
        if (P(p, keyed)) { \
            struct async_key k_ = {.point = P(p, id)}; \
            TP_KEYS(p, k_, key); \
            async_start(&k_, p, &v_, tp_string(ctx, P(p, t_name_off), P(p, t_name_size))); \
        } else { \
            task_start(p, &v_); \
        } \
    } while (0)

/* an NFSv4 operation's end (server_operation): the operation's name is the point's name field */
#define OPERATION(p) server_operation(tp_string(ctx, P(p, t_name_off), P(p, t_name_size)))

#define TP_EXIT(p) \
    do { \
        s64 bytes_ = P(p, t_exit_bytes_size) ? TPF(p, exit_bytes) : -1; \
        if (P(p, keyed)) { \
            struct async_key k_ = {.point = P(p, id)}; \
            TP_KEYS(p, k_, exit_key); \
            async_end(ctx, &k_, p, bytes_); \
        } else { \
            task_end(ctx, p, bytes_, tp_string(ctx, P(p, t_exit_name_off), P(p, t_exit_name_size))); \
        } \
    } while (0)
