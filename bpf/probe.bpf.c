/* probekit latency probe core (kernel side of nfsslower / nfsdist / nfstop).
 *
 * This file is not compiled alone: probes/generate.py puts in front of it the
 * generated constants (operation ids, struct member offsets from BTF, tool
 * features) and `struct event`, and after it one small handler per attach
 * point chosen on this kernel. Headers stay minimal on purpose: bcc compiles
 * at start-up and every kernel header costs seconds under emulation; struct
 * layouts come from BTF offsets instead of <linux/fs.h>. The generated part
 * includes the one header needed, <uapi/linux/ptrace.h> (struct pt_regs).
 *
 * Generated constants used here:
 *   NPOINTS, NOPS, TARGET_TGID (0 = every process), MIN_LAT_NS, MAX_LAT_NS,
 *   WANT_EVENTS, WANT_DIST, WANT_TOP, HAVE_ASYNC, NKEYS, DIST_UNIT_NS, CGROUP_FILTER,
 *   MOUNT_DEV (0 = every mount), DEV_AT_ENTRY,
 *   USE_RINGBUF (RINGBUF_PAGES), USE_TASK_STORAGE, HAVE_FILE_NAME (OFF_FILE_PATH_DENTRY),
 *   HAVE_DENTRY_NAME (OFF_DENTRY_NAME), WANT_INFLIGHT (INFLIGHT_SLOTS),
 *   PTR_NONE, PTR_FILE, PTR_DENTRY, NAME_LEN, COMM_LEN, WANT_LAT_SUM, WANT_DEV (maps keyed by
 *   mount: MAX_MOUNTS; HAVE_FILE_SB: OFF_FILE_INODE, OFF_INODE_SB; HAVE_DENTRY_SB: OFF_DENTRY_SB;
 *   OFF_SB_DEV; HAVE_FILE_INO: OFF_INODE_INO), DIST_ENTRIES, TOTAL_ENTRIES, WANT_CGROUP_KEY
 *   (histograms keyed by the task's cgroup too: MAX_CGROUPS, with WANT_DEV), WANT_SERVER
 *   (nfsdtop: requests keyed by client address, procedure and export; PROC_LEN, REQUEST_SLOTS).
 */
/* start of one operation on one thread: keyed by (thread, attach point) so that
 * operations nesting on a thread (one traced function inside another) are each
 * timed and counted */
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
    u64 dev;      /* the superblock's s_dev (the mount): at entry where DEV_AT_ENTRY or a
                   * tracepoint field has it, else found for printed events only */
};

#if USE_TASK_STORAGE
/* per thread, one slot per attach point (ts 0 = none): found through the task
 * itself, without hashing, bucket locks or a free list (kernel >= 5.11); freed
 * with the task */
struct task_starts {
    struct start_val at[NPOINTS];
};
BPF_TASK_STORAGE(task_starts, struct task_starts);
#else
BPF_HASH(starts, struct start_key, struct start_val, 10240);
#endif

#if HAVE_ASYNC
/* starts whose end fires in another task (RPC completion in rpciod/kworker):
 * matched on the spec's key fields instead of the thread */
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

BPF_HASH(async_starts, struct async_key, struct async_val, 10240);
#endif

/* [0] deltas dropped as impossible (end before start, or above MAX_LAT_NS) */
BPF_ARRAY(anomalies, u64, 1);

/* [op] operations seen to start or end that could not be timed: the start store refused
 * them (task local storage is busy on this CPU while another task holds it, e.g. one
 * exiting; a hash map is full). With the runs the kernel skipped itself (a program's
 * recursion_misses), user space accounts for every operation not counted. */
BPF_ARRAY(untimed, u64, NOPS);

static __always_inline void count_untimed(u32 op)
{
    u64 *n = untimed.lookup(&op);
    if (n)
        __sync_fetch_and_add(n, 1);
}

#if WANT_INFLIGHT
/* Operations in flight, readable from user space while they last (a stuck operation
 * never reaches record(): this is how it is seen at all). One slot per thread, chosen
 * by thread id, holding the thread's outermost operation's start itself: that start is
 * stored here instead of in task storage or the hash, so tracking it costs no second
 * store (and, under emulation, no second page touched). Operations nested inside it, or
 * of a thread whose slot another thread holds, go to the usual store. Async starts
 * (async_starts) are readable as they are. */
struct inflight_slot {
    struct start_val s;  /* s.ts: start time; 0 = free */
    u32 tid;      /* its process: /proc/TID/status, read only for a stuck thread */
    u16 op;
    u16 point;
    s64 call;     /* the system call it began in (current_call) */
};
BPF_ARRAY(inflight, struct inflight_slot, INFLIGHT_SLOTS);
/* [0] operations not shown in flight because another thread held their slot */
BPF_ARRAY(inflight_lost, u64, 1);

/* What the current thread entered the kernel for: the system call number (orig_ax of the
 * registers it entered with; an exception's error code; 0 for kernel threads). A thread is in
 * one call at a time, so an operation it started in another call has ended, whether or not
 * the probe saw its end (the kernel skips a program while that CPU's BPF guard is held).
 * Kernels before 5.15 have no bpf_task_pt_regs: there every start counts as of one call. */
static __always_inline s64 current_call(void)
{
    s64 call = 0;
#if USE_TASK_STORAGE && LINUX_VERSION_CODE >= KERNEL_VERSION(5, 15, 0)
    char *regs = (char *)bpf_task_pt_regs(bpf_get_current_task_btf());
    bpf_probe_read_kernel(&call, sizeof(call), regs + __builtin_offsetof(struct pt_regs, orig_ax));
#endif
    return call;
}

/* 1 when the slot took the start (the caller stores nothing else) */
static __always_inline int inflight_start(u64 id, u32 point, u32 op, struct start_val *v)
{
    u32 idx = (u32)id & (INFLIGHT_SLOTS - 1);
    struct inflight_slot *slot = inflight.lookup(&idx);
    s64 call = current_call();
    if (!slot)
        return 0;
    if (slot->s.ts) {
        if (slot->tid == (u32)id && slot->point != point && slot->call == call)
            return 0;  /* nested inside this thread's outer operation */
        if (slot->tid != (u32)id) {
            u32 zero = 0;
            u64 *lost = inflight_lost.lookup(&zero);
            if (lost)
                __sync_fetch_and_add(lost, 1);
            return 0;
        }
    }
    /* free, the same point again, or an operation of an earlier call whose end was missed */
    slot->s = *v;
    slot->tid = (u32)id;
    slot->op = op;
    slot->point = point;
    slot->call = call;
    return 1;
}

/* 1 when this thread's slot held the start of `point` (copied to *out, slot freed) */
static __always_inline int inflight_end(u64 id, u32 point, struct start_val *out)
{
    u32 idx = (u32)id & (INFLIGHT_SLOTS - 1);
    struct inflight_slot *slot = inflight.lookup(&idx);
    if (!slot || !slot->s.ts || slot->tid != (u32)id || slot->point != point)
        return 0;
    *out = slot->s;
    slot->s.ts = 0;
    return 1;
}
#endif

#if WANT_EVENTS
#if USE_RINGBUF
/* slow events. Submitted without a wakeup: a wakeup queues irq_work whose
 * handler (waking the reader) runs inside this program's time (measured: most
 * of an event's cost); user space reads on a short timer instead. */
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
/* [0] events dropped because the ring buffer was full */
BPF_ARRAY(lost_events, u64, 1);
#else
BPF_PERF_OUTPUT(events);
#endif
#endif

#if WANT_DIST
struct dist_key {
    u32 op;
    u32 slot;
#if WANT_DEV
    u32 dev;
    u32 pad;
#endif
#if WANT_CGROUP_KEY
    u64 cgroup;   /* an admitted cgroup v2 id, or 0: every other cgroup (the overflow series) */
#endif
};
#if WANT_CGROUP_KEY
/* allocated as used: room for every key is far more than a fleet's cgroups ever fill */
BPF_F_TABLE("hash", struct dist_key, u64, dist, DIST_ENTRIES, BPF_F_NO_PREALLOC);
/* the cgroups that get series of their own: the first MAX_CGROUPS seen (user space deletes
 * the ones gone), so the label set stays bounded however many units come and go */
BPF_HASH(cgroup_ids, u64, u8, MAX_CGROUPS);

static __always_inline u64 admitted_cgroup(u64 id)
{
    u8 one = 1;
    if (cgroup_ids.lookup(&id))
        return id;
    /* refused when full; a racing CPU's insert of the same id makes the lookup succeed */
    if (cgroup_ids.insert(&id, &one) == 0 || cgroup_ids.lookup(&id))
        return id;
    return 0;
}
#else
BPF_HISTOGRAM(dist, struct dist_key, DIST_ENTRIES);
#endif
/* per op: bytes moved and, for the exporter (WANT_LAT_SUM), the sum of latencies (a
 * Prometheus histogram's _sum), both added under the one lookup */
struct op_total {
    u64 bytes;
    u64 lat_ns;
};
#if WANT_DEV
struct total_key {
    u32 op;
    u32 dev;
#if WANT_CGROUP_KEY
    u64 cgroup;
#endif
};
#if WANT_CGROUP_KEY
BPF_F_TABLE("hash", struct total_key, struct op_total, op_totals, TOTAL_ENTRIES, BPF_F_NO_PREALLOC);
#else
BPF_HASH(op_totals, struct total_key, struct op_total, TOTAL_ENTRIES);
#endif
#else
BPF_ARRAY(op_totals, struct op_total, NOPS);
#endif
#endif

#if WANT_TOP
struct top_key {
    u32 tgid;
    u32 op;
    u32 dev;      /* the mount with WANT_DEV (nfstop --by mount), else 0 */
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
BPF_HASH(top_stats, struct top_key, struct top_val, 10240);
BPF_HASH(top_hist, struct top_hist_key, u64, 40960);
#endif

static __always_inline u64 read_ptr(u64 addr)
{
    u64 val = 0;
    bpf_probe_read_kernel(&val, sizeof(val), (void *)addr);
    return val;
}

#if WANT_SERVER
/* An NFS server's requests (nfsdtop): a request is timed on its nfsd thread from the
 * dispatch of the decoded call to the encoded reply, and counted per (client address,
 * procedure). The reads and writes timed inside it add their bytes to it, whatever
 * their own attach points are. */
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
    struct server_key k;
};
BPF_HASH(requests, u32, struct server_request, REQUEST_SLOTS);
struct server_val {
    u64 count;
    u64 lat_ns;
    u64 rd_bytes;
    u64 wr_bytes;
};
BPF_HASH(server_stats, struct server_key, struct server_val, 10240);
struct server_hist_key {
    struct server_key k;
    u32 slot;     /* log2 of the service time in microseconds */
    u32 pad;
};
BPF_HASH(server_hist, struct server_hist_key, u64, 40960);

/* `addr`: the kernel address of the client's struct sockaddr_storage; `proc`: the
 * procedure's name string; `prog`, `vers`: the addresses of the request's u32 program and
 * version (each 0 where unknown) */
static __always_inline void server_start(u64 addr, u64 proc, u64 prog, u64 vers)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct server_request r;
    u16 family = 0;
    __builtin_memset(&r, 0, sizeof(r));
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
    if (requests.update(&tid, &r))
        count_untimed(OP_RPC);
}

/* fh_verify's entry: the file handle (struct svc_fh *) it verifies for the thread's request */
static __always_inline void server_fh(u64 fh)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct server_request *r = requests.lookup(&tid);
    if (r)
        r->fh = fh;
}

/* fh_verify's return: the verified handle's export (svc_fh.fh_export, set by fh_verify) names
 * the request's export, by its root's inode and superblock dev; the offsets come from BTF:
 * `fh_export` in the handle, `dentry` (ex_path.dentry) in the export, then dentry->d_inode,
 * inode->i_ino, dentry->d_sb, sb->s_dev. A COMPOUND that verifies several handles keeps the
 * last one's export (its PUTFH, past the pseudo root's LOOKUPs). */
static __always_inline void server_export(u64 fh_export, u64 dentry, u64 d_inode, u64 i_ino, u64 d_sb, u64 s_dev)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct server_request *r = requests.lookup(&tid);
    u64 exp, root;
    if (!r || !r->fh)
        return;
    exp = read_ptr(r->fh + fh_export);
    r->fh = 0;
    if (!exp)
        return;
    root = read_ptr(exp + dentry);
    r->k.exp_ino = read_ptr(read_ptr(root + d_inode) + i_ino);
    r->k.exp_dev = (u32)read_ptr(read_ptr(root + d_sb) + s_dev);
}

/* the bytes a read or write inside the thread's request moved */
static __always_inline void server_bytes(u32 op, u64 bytes)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct server_request *r = requests.lookup(&tid);
    if (!r)
        return;
#ifdef OP_READ
    if (op == OP_READ)
        r->rd_bytes += bytes;
#endif
#ifdef OP_WRITE
    if (op == OP_WRITE)
        r->wr_bytes += bytes;
#endif
}
#endif

#if CGROUP_FILTER
/* [0]: the cgroup v2 directory given by --cgroup (user space stores its fd) */
BPF_CGROUP_ARRAY(cgroup_filter, 1);
#endif

/* filters, at the start of an operation only: an operation let in is timed to its end */
static __always_inline int want_task(u64 pid_tgid, struct start_val *v)
{
    if (TARGET_TGID != 0 && (u32)(pid_tgid >> 32) != TARGET_TGID)
        return 0;
#if MOUNT_DEV
    if ((u32)v->dev != MOUNT_DEV)
        return 0;
#endif
#if CGROUP_FILTER
    /* 1 when the current task is in the cgroup's subtree */
    if (cgroup_filter.check_current_task(0) != 1)
        return 0;
#endif
    return 1;
}

static __always_inline void task_start(u32 point, u32 op, struct start_val *v)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!want_task(id, v))
        return;
    v->ts = bpf_ktime_get_ns();
#if WANT_INFLIGHT
    if (inflight_start(id, point, op, v))
        return;
#endif
#if USE_TASK_STORAGE
    struct task_starts *t = task_starts.task_storage_get(bpf_get_current_task_btf(), 0,
                                                         BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!t || point >= NPOINTS) {
        count_untimed(op);
        return;
    }
    t->at[point] = *v;
#else
    struct start_key k;
    k.tid = (u32)id;
    k.point = point;
    if (starts.update(&k, v))
        count_untimed(op);
#endif
}

/* s_dev of the superblock a struct file * or struct dentry * belongs to (0 if unknown):
 * two or three reads, at entry for DEV_AT_ENTRY, else only for printed events */
static __always_inline u64 dev_of(u64 ptr, int ptr_kind)
{
    u64 sb = 0;
    u32 dev = 0;
#if HAVE_FILE_SB
    if (ptr_kind == PTR_FILE)
        sb = read_ptr(read_ptr(ptr + OFF_FILE_INODE) + OFF_INODE_SB);
#endif
#if HAVE_DENTRY_SB
    if (ptr_kind == PTR_DENTRY)
        sb = read_ptr(ptr + OFF_DENTRY_SB);
#endif
    if (sb)
        bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(sb + OFF_SB_DEV));
    return dev;
}

static __always_inline void name_of(char *dst, u64 ptr, int ptr_kind)
{
    u64 dentry = 0;
#if HAVE_FILE_NAME
    if (ptr_kind == PTR_FILE)
        dentry = read_ptr(ptr + OFF_FILE_PATH_DENTRY);
#endif
    if (ptr_kind == PTR_DENTRY)
        dentry = ptr;
#if HAVE_DENTRY_NAME
    if (dentry)
        bpf_probe_read_kernel_str(dst, NAME_LEN, (void *)read_ptr(dentry + OFF_DENTRY_NAME));
#endif
}

#if WANT_EVENTS
/* zeroed first: the record goes to user space whole, padding and unused name bytes included */
static __always_inline void fill_event(struct event *e, u32 op, u32 pid, const char *comm, u64 cgroup,
                                       u64 now, u64 delta, struct start_val *s, int ptr_kind, const char *name)
{
    __builtin_memset(e, 0, sizeof(*e));
    e->end_ns = now;
    e->lat_ns = delta;
    e->bytes = s->bytes;
    e->offset = s->offset;
    e->fileid = s->fileid;
    e->dev = s->dev ? s->dev : (s->ptr ? dev_of(s->ptr, ptr_kind) : 0);
    e->cgroup = cgroup;
#if HAVE_FILE_INO
    /* the inode number (NFS: the fileid) of a file-timed operation: user space names the
     * tracepoint-timed lines of the same inode (fsync, getattr) from it */
    if (!e->fileid && s->ptr && ptr_kind == PTR_FILE)
        e->fileid = read_ptr(read_ptr(s->ptr + OFF_FILE_INODE) + OFF_INODE_INO);
#endif
    e->pid = pid;
    e->op = op;
    if (comm)
        __builtin_memcpy(e->comm, comm, COMM_LEN);
    else
        bpf_get_current_comm(&e->comm, sizeof(e->comm));
    if (name)
        bpf_probe_read_kernel_str(e->name, NAME_LEN, name);
    else if (s->ptr)
        name_of(e->name, s->ptr, ptr_kind);
}
#endif

/* one finished operation: a sane delta feeds the histograms and, above the
 * threshold, one event (`name`: the file or RPC name where an event field has it, read
 * only for printed events). `comm` and `cgroup` are the starting task's when the end
 * runs in another task (async), else comm is 0 and the current task's are taken. */
static __always_inline void record(void *ctx, u32 op, u32 pid, const char *comm, u64 cgroup, u64 now,
                                   u64 delta, struct start_val *s, int ptr_kind, const char *name)
{
#if WANT_SERVER
    server_bytes(op, s->bytes);
#endif
#if WANT_DIST
    {
        struct dist_key dk;
        struct op_total *total;
        u64 zero = 0, *n;
        u32 opi = op;
        __builtin_memset(&dk, 0, sizeof(dk));
        dk.op = op;
        dk.slot = bpf_log2l(delta / DIST_UNIT_NS);
#if WANT_CGROUP_KEY
        dk.cgroup = admitted_cgroup(comm ? cgroup : bpf_get_current_cgroup_id());
#endif
#if WANT_DEV
        dk.dev = (u32)s->dev;
        {
            struct total_key tk;
            struct op_total none;
            __builtin_memset(&tk, 0, sizeof(tk));
            __builtin_memset(&none, 0, sizeof(none));
            tk.op = op;
            tk.dev = (u32)s->dev;
#if WANT_CGROUP_KEY
            tk.cgroup = dk.cgroup;
#endif
            total = op_totals.lookup_or_try_init(&tk, &none);
        }
#else
        total = op_totals.lookup(&opi);
#endif
        /* a full histogram map would drop the operation silently: count it as untimed */
        n = dist.lookup_or_try_init(&dk, &zero);
        if (n)
            __sync_fetch_and_add(n, 1);
        else
            count_untimed(op);
        if (total) {
            __sync_fetch_and_add(&total->bytes, s->bytes);
#if WANT_LAT_SUM
            __sync_fetch_and_add(&total->lat_ns, delta);
#endif
        }
    }
#endif
#if WANT_TOP
    {
        struct top_key tk;
        struct top_hist_key hk;
        struct top_val zero;
        struct top_val *tv;
        __builtin_memset(&tk, 0, sizeof(tk));
        __builtin_memset(&hk, 0, sizeof(hk));
        __builtin_memset(&zero, 0, sizeof(zero));
        tk.tgid = pid;
        tk.op = op;
#if WANT_DEV
        tk.dev = (u32)s->dev;
        hk.dev = (u32)s->dev;
#endif
        tv = top_stats.lookup_or_try_init(&tk, &zero);
        if (tv) {
            if (tv->count == 0) {
                if (comm) {
                    __builtin_memcpy(tv->comm, comm, COMM_LEN);
                    tv->cgroup = cgroup;
                } else {
                    bpf_get_current_comm(&tv->comm, sizeof(tv->comm));
                    tv->cgroup = bpf_get_current_cgroup_id();
                }
            }
            __sync_fetch_and_add(&tv->count, 1);
            __sync_fetch_and_add(&tv->lat_ns, delta);
            __sync_fetch_and_add(&tv->bytes, s->bytes);
        }
        hk.tgid = pid;
        hk.op = op;
        hk.slot = bpf_log2l(delta / 1000);
        top_hist.increment(hk);
    }
#endif
#if WANT_EVENTS
    if (delta >= MIN_LAT_NS) {
#if USE_RINGBUF
        struct event *e = events.ringbuf_reserve(sizeof(struct event));
        if (!e) {
            u32 zero = 0;
            u64 *lost = lost_events.lookup(&zero);
            if (lost)
                __sync_fetch_and_add(lost, 1);
            return;
        }
        fill_event(e, op, pid, comm, comm ? cgroup : bpf_get_current_cgroup_id(), now, delta, s, ptr_kind,
                   name);
        events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
#else
        struct event e;
        fill_event(&e, op, pid, comm, comm ? cgroup : bpf_get_current_cgroup_id(), now, delta, s, ptr_kind,
                   name);
        events.perf_submit(ctx, &e, sizeof(e));
#endif
    }
#endif
}

/* a delta is only trusted when the end is after the start and below MAX_LAT_NS:
 * a missed entry has no start (nothing is printed), a clock oddity is counted */
static __always_inline int sane_delta(u64 start, u64 now)
{
    if (start == 0 || now < start || now - start > MAX_LAT_NS) {
        u32 zero = 0;
        u64 *bad = anomalies.lookup(&zero);
        if (bad)
            __sync_fetch_and_add(bad, 1);
        return 0;
    }
    return 1;
}

/* end of a same-thread operation; bytes_at_end >= 0 replaces the entry's byte count */
static __always_inline void task_end(void *ctx, u32 point, u32 op, s64 bytes_at_end, int ptr_kind,
                                     const char *name)
{
    u64 id = bpf_get_current_pid_tgid();
    struct start_val s;
    struct start_val *found;
    u64 now = bpf_ktime_get_ns();
    int held = 0;
#if WANT_INFLIGHT
    held = inflight_end(id, point, &s);
#endif
    if (!held) {
#if USE_TASK_STORAGE
        /* F_CREATE: NULL then means busy (counted), not a task that never started anything */
        struct task_starts *t = task_starts.task_storage_get(bpf_get_current_task_btf(), 0,
                                                             BPF_LOCAL_STORAGE_GET_F_CREATE);
        if (!t || point >= NPOINTS) {
            count_untimed(op);
            return;
        }
        found = &t->at[point];
        if (found->ts == 0)
            return;
        s = *found;
        found->ts = 0;
#else
        struct start_key k;
        k.tid = (u32)id;
        k.point = point;
        found = starts.lookup(&k);
        if (!found)
            return;
        s = *found;
        starts.delete(&k);
#endif
    }
    if (!sane_delta(s.ts, now))
        return;
    if (bytes_at_end >= 0)
        s.bytes = bytes_at_end;
    record(ctx, op, (u32)(id >> 32), 0, 0, now, now - s.ts, &s, ptr_kind, name);
}

#if HAVE_ASYNC
static __always_inline void async_start(struct async_key *k, u32 op, struct start_val *s, const char *name)
{
    u64 id = bpf_get_current_pid_tgid();
    struct async_val v;
    if (!want_task(id, s))
        return;
    __builtin_memset(&v, 0, sizeof(v));
    v.s = *s;
    v.s.ts = bpf_ktime_get_ns();
    v.pid = (u32)(id >> 32);
    v.tid = (u32)id;
    v.cgroup = bpf_get_current_cgroup_id();
    bpf_get_current_comm(&v.comm, sizeof(v.comm));
    if (name)
        bpf_probe_read_kernel_str(v.name, NAME_LEN, name);
    if (async_starts.update(k, &v))
        count_untimed(op);
}

static __always_inline void async_end(void *ctx, struct async_key *k, u32 op, s64 bytes_at_end)
{
    struct async_val *found = async_starts.lookup(k);
    struct async_val v;
    u64 now;
    if (!found)
        return;
    now = bpf_ktime_get_ns();
    v = *found;
    async_starts.delete(k);
    if (!sane_delta(v.s.ts, now))
        return;
    if (bytes_at_end >= 0)
        v.s.bytes = bytes_at_end;
    record(ctx, op, v.pid, v.comm, v.cgroup, now, now - v.s.ts, &v.s, PTR_NONE, v.name[0] ? v.name : 0);
}

/* the end of a start tracked in flight only (an RPC beneath the operations asked): it
 * leaves the in-flight view, and nothing is recorded */
static __always_inline void async_forget(struct async_key *k)
{
    async_starts.delete(k);
}
#endif

#if WANT_SERVER
static __always_inline void server_end(void)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct server_request *found = requests.lookup(&tid);
    struct server_request r;
    struct server_val zero;
    struct server_val *sv;
    struct server_hist_key hk;
    u64 now = bpf_ktime_get_ns();
    if (!found)
        return;
    r = *found;
    requests.delete(&tid);
    if (!sane_delta(r.ts, now))
        return;
    __builtin_memset(&zero, 0, sizeof(zero));
    sv = server_stats.lookup_or_try_init(&r.k, &zero);
    if (!sv) {
        count_untimed(OP_RPC);
        return;
    }
    __sync_fetch_and_add(&sv->count, 1);
    __sync_fetch_and_add(&sv->lat_ns, now - r.ts);
    __sync_fetch_and_add(&sv->rd_bytes, r.rd_bytes);
    __sync_fetch_and_add(&sv->wr_bytes, r.wr_bytes);
    __builtin_memset(&hk, 0, sizeof(hk));
    hk.k = r.k;
    hk.slot = bpf_log2l((now - r.ts) / 1000);
    server_hist.increment(hk);
}
#endif

/* generated handlers follow */
