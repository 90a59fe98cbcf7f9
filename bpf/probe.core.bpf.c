/* probekit latency probe, CO-RE form: compiled once, where the wheel is built, and loaded
 * with libbpf on the client (no compiler, no kernel headers there).
 *
 * It differs from probe.bpf.c (the bcc form) in what is fixed when: that file is compiled
 * on the client for the attach points chosen there, with every setting a #define. This one
 * holds every candidate attach point of the spec as its own programs (the loader autoloads
 * the chosen ones), every setting in the read-only `cfg` the loader fills before loading
 * (the verifier then prunes what a setting turns off), and reads kernel structs through
 * CO-RE relocations on the minimal definitions below instead of offsets baked in.
 *
 * probes/generate_core.py puts at GENERATED below NPOINTS, NSLOTS, NKEYS, MAX_DEREFS,
 * NAME_LEN, COMM_LEN, INFLIGHT_SLOTS, RINGBUF_BYTES, NOPS_MAX, MAX_LAT_NS, ARG_*, NO_PARAM,
 * PTR_*, TP_*, `struct event` and `struct cfg`, and after the end one program per attach
 * point end (one per tracepoint).
 */
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s64 s64;

/* GENERATED */

char LICENSE[] SEC("license") = "GPL";

/* The kernel structs the probe follows, reduced to the members it reads: CO-RE finds each
 * member in the running kernel's BTF, wherever that kernel put it. */
struct qstr {
    const unsigned char *name;
} __attribute__((preserve_access_index));

struct super_block {
    u32 s_dev;
} __attribute__((preserve_access_index));

struct dentry {
    struct qstr d_name;
    struct super_block *d_sb;
} __attribute__((preserve_access_index));

struct path {
    struct dentry *dentry;
} __attribute__((preserve_access_index));

struct inode {
    unsigned long i_ino;
    struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
    struct path f_path;
    struct inode *f_inode;
} __attribute__((preserve_access_index));

/* x86-64 registers: of a kprobe's context, for its arguments and return value; of a thread's
 * entry into the kernel, for the system call it is in (orig_ax) */
struct pt_regs {
    unsigned long di;
    unsigned long si;
    unsigned long dx;
    unsigned long cx;
    unsigned long r8;
    unsigned long r9;
    unsigned long ax;
    unsigned long orig_ax;
} __attribute__((preserve_access_index));

/* filled by the loader before loading (read-only then: the verifier knows every value) */
const volatile struct cfg cfg SEC(".rodata.cfg");

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
    u64 dev;
};

/* per thread, one slot per chosen attach point (cfg.points[].slot; ts 0 = none) */
struct task_starts {
    struct start_val at[NSLOTS];
};

struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct task_starts);
} task_starts SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 10240);
    __type(key, struct start_key);
    __type(value, struct start_val);
} starts SEC(".maps");

struct async_key {
    u32 point;
    u32 pad;
    u64 k[NKEYS];
};

struct async_val {
    struct start_val s;
    u32 pid;
    u32 tid;
    u64 cgroup;
    char comm[COMM_LEN];
    char name[NAME_LEN];
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 10240);
    __type(key, struct async_key);
    __type(value, struct async_val);
} async_starts SEC(".maps");

#define COUNTER(name, n) \
    struct { \
        __uint(type, BPF_MAP_TYPE_ARRAY); \
        __uint(max_entries, n); \
        __type(key, u32); \
        __type(value, u64); \
    } name SEC(".maps")

COUNTER(anomalies, 1);
COUNTER(untimed, NOPS_MAX);
COUNTER(inflight_lost, 1);
COUNTER(lost_events, 1);

struct inflight_slot {
    struct start_val s;
    u32 tid;
    u16 op;
    u16 point;
    s64 call;  /* the system call it began in (current_call) */
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, INFLIGHT_SLOTS);
    __type(key, u32);
    __type(value, struct inflight_slot);
} inflight SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, RINGBUF_BYTES);
} events SEC(".maps");

/* histogram and totals keys carry the mount and cgroup always (0 where the tool does not
 * key by them): one layout, and the loader sizes the maps for what the tool keys */
struct dist_key {
    u32 op;
    u32 slot;
    u32 dev;
    u32 pad;
    u64 cgroup;
};

struct total_key {
    u32 op;
    u32 dev;
    u64 cgroup;
};

struct op_total {
    u64 bytes;
    u64 lat_ns;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __uint(max_entries, 1);  /* the loader sets dist_entries() */
    __type(key, struct dist_key);
    __type(value, u64);
} dist SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1);  /* the loader sets total_entries() */
    __type(key, struct total_key);
    __type(value, struct op_total);
} op_totals SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1);  /* the loader sets the tool's cgroup limit */
    __type(key, u64);
    __type(value, u8);
} cgroup_ids SEC(".maps");

struct top_key {
    u32 tgid;
    u32 op;
    u32 dev;
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
    u64 cgroup;
    char comm[COMM_LEN];
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 10240);
    __type(key, struct top_key);
    __type(value, struct top_val);
} top_stats SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 40960);
    __type(key, struct top_hist_key);
    __type(value, u64);
} top_hist SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u32);
} cgroup_filter SEC(".maps");

static __always_inline void count(void *map, u32 index)
{
    u64 *n = bpf_map_lookup_elem(map, &index);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline u64 read_ptr(u64 addr)
{
    u64 val = 0;
    bpf_probe_read_kernel(&val, sizeof(val), (void *)addr);
    return val;
}

/* the histogram slot of v, bcc's bpf_log2l: floor(log2 v) + 1, and 1 for 0, so that slot k
 * holds [2^(k-1), 2^k - 1] whichever loader ran (the readers and the exporter's buckets
 * count on it) */
static __always_inline u32 log2l(u64 v)
{
    u32 r = 0;
    for (int i = 32; i > 0; i >>= 1) {
        if (v >= (1ULL << i)) {
            v >>= i;
            r += i;
        }
    }
    return r + 1;
}

/* argument `param` of a kprobe (x86-64 calling convention), 0 past the sixth */
static __always_inline u64 kprobe_arg(struct pt_regs *ctx, u32 param)
{
    u64 val = 0;
    u32 off;
    switch (param) {
    case 0: off = bpf_core_field_offset(struct pt_regs, di); break;
    case 1: off = bpf_core_field_offset(struct pt_regs, si); break;
    case 2: off = bpf_core_field_offset(struct pt_regs, dx); break;
    case 3: off = bpf_core_field_offset(struct pt_regs, cx); break;
    case 4: off = bpf_core_field_offset(struct pt_regs, r8); break;
    case 5: off = bpf_core_field_offset(struct pt_regs, r9); break;
    default: return 0;
    }
    bpf_probe_read_kernel(&val, sizeof(val), (void *)ctx + off);
    return val;
}

static __always_inline s64 kprobe_ret(struct pt_regs *ctx)
{
    u64 val = 0;
    bpf_probe_read_kernel(&val, sizeof(val), (void *)ctx + bpf_core_field_offset(struct pt_regs, ax));
    return (s64)val;
}

/* a parameter followed through its derefs (cfg: which parameter, which offsets) */
static __always_inline u64 follow(u64 val, u32 point, int which)
{
    for (int i = 0; i < MAX_DEREFS; i++) {
        if (i >= cfg.points[point].arg[which].nderefs)
            break;
        val = read_ptr(val + cfg.points[point].arg[which].off[i]);
    }
    return val;
}

/* a tracepoint field (cfg: offset, size, signedness; size 0 = absent), widened to 64 bits */
static __always_inline s64 tp_field(void *ctx, u32 point, int which)
{
    u16 off = cfg.points[point].tp[which].off;
    u16 size = cfg.points[point].tp[which].size;
    u64 raw = 0;
    if (size == 0 || size > 8)
        return 0;
    bpf_probe_read_kernel(&raw, size, ctx + off);
    if (cfg.points[point].tp[which].is_signed && size < 8 && (raw >> (size * 8 - 1)) & 1)
        raw |= ~0ULL << (size * 8);
    return (s64)raw;
}

/* a tracepoint's __data_loc char[] field: the string's address, or 0 */
static __always_inline const char *tp_string(void *ctx, u32 point, int which)
{
    u32 loc = 0;
    if (cfg.points[point].tp[which].size != 4)
        return 0;
    bpf_probe_read_kernel(&loc, sizeof(loc), ctx + cfg.points[point].tp[which].off);
    return (const char *)ctx + (loc & 0xFFFF);
}

/* What the current thread entered the kernel for: the system call number (orig_ax of the
 * registers it entered with; an exception's error code; 0 for kernel threads). A thread is in
 * one call at a time, so an operation it started in another call has ended, whether or not
 * the probe saw its end (the kernel skips a program while that CPU's BPF guard is held). */
static __always_inline s64 current_call(void)
{
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    return (s64)BPF_CORE_READ(regs, orig_ax);
}

static __always_inline int inflight_start(u64 id, u32 point, u32 op, struct start_val *v)
{
    u32 idx = (u32)id & (INFLIGHT_SLOTS - 1);
    struct inflight_slot *slot = bpf_map_lookup_elem(&inflight, &idx);
    s64 call = current_call();
    if (!slot)
        return 0;
    if (slot->s.ts) {
        if (slot->tid == (u32)id && slot->point != point && slot->call == call)
            return 0;  /* nested inside this thread's outer operation */
        if (slot->tid != (u32)id) {
            count(&inflight_lost, 0);
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

static __always_inline int inflight_end(u64 id, u32 point, struct start_val *out)
{
    u32 idx = (u32)id & (INFLIGHT_SLOTS - 1);
    struct inflight_slot *slot = bpf_map_lookup_elem(&inflight, &idx);
    if (!slot || !slot->s.ts || slot->tid != (u32)id || slot->point != point)
        return 0;
    *out = slot->s;
    slot->s.ts = 0;
    return 1;
}

static __always_inline int want_task(u64 pid_tgid, struct start_val *v)
{
    if (cfg.target_tgid && (u32)(pid_tgid >> 32) != cfg.target_tgid)
        return 0;
    if (cfg.mount_dev && (u32)v->dev != cfg.mount_dev)
        return 0;
    if (cfg.cgroup_filter && bpf_current_task_under_cgroup(&cgroup_filter, 0) != 1)
        return 0;
    return 1;
}

/* s_dev of the superblock of a struct file * or struct dentry * (0 if unknown) */
static __always_inline u64 dev_of(u64 ptr, u32 ptr_kind)
{
    struct super_block *sb = 0;
    if (ptr_kind == PTR_FILE)
        sb = BPF_CORE_READ((struct file *)ptr, f_inode, i_sb);
    else if (ptr_kind == PTR_DENTRY)
        sb = BPF_CORE_READ((struct dentry *)ptr, d_sb);
    return sb ? BPF_CORE_READ(sb, s_dev) : 0;
}

static __always_inline void name_of(char *dst, u64 ptr, u32 ptr_kind)
{
    struct dentry *dentry = 0;
    if (ptr_kind == PTR_FILE)
        dentry = BPF_CORE_READ((struct file *)ptr, f_path.dentry);
    else if (ptr_kind == PTR_DENTRY)
        dentry = (struct dentry *)ptr;
    if (dentry)
        bpf_probe_read_kernel_str(dst, NAME_LEN, BPF_CORE_READ(dentry, d_name.name));
}

/* `point` indexes cfg.points (the object's numbering); what goes into maps is the point's
 * id as user space numbers it (cfg.points[].id) */
static __always_inline void task_start(u32 point, struct start_val *v)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 op = cfg.points[point].op;
    u32 slot = cfg.points[point].slot;
    u32 user_id = cfg.points[point].id;
    if (!want_task(id, v))
        return;
    v->ts = bpf_ktime_get_ns();
    if (cfg.want_inflight && inflight_start(id, user_id, op, v))
        return;
    if (cfg.task_storage) {
        struct task_starts *t = bpf_task_storage_get(&task_starts, bpf_get_current_task_btf(), 0,
                                                     BPF_LOCAL_STORAGE_GET_F_CREATE);
        if (!t || slot >= NSLOTS) {
            count(&untimed, op);
            return;
        }
        t->at[slot] = *v;
    } else {
        struct start_key k = {.tid = (u32)id, .point = user_id};
        if (bpf_map_update_elem(&starts, &k, v, BPF_ANY))
            count(&untimed, op);
    }
}

static __always_inline void fill_event(struct event *e, u32 op, u32 pid, const char *comm, u64 cgroup,
                                       u64 now, u64 delta, struct start_val *s, u32 ptr_kind, const char *name)
{
    __builtin_memset(e, 0, sizeof(*e));
    e->end_ns = now;
    e->lat_ns = delta;
    e->bytes = s->bytes;
    e->offset = s->offset;
    e->fileid = s->fileid;
    e->dev = s->dev ? s->dev : (s->ptr ? dev_of(s->ptr, ptr_kind) : 0);
    e->cgroup = cgroup;
    if (!e->fileid && s->ptr && ptr_kind == PTR_FILE) {
        /* the pointer first: inside BPF_CORE_READ, s->ptr would be relocated as a kernel member */
        struct file *file = (struct file *)s->ptr;
        e->fileid = BPF_CORE_READ(file, f_inode, i_ino);
    }
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

/* the cgroup id an admitted series is keyed by: the first cfg.max_cgroups seen, else 0 */
static __always_inline u64 admitted_cgroup(u64 id)
{
    u8 one = 1;
    if (bpf_map_lookup_elem(&cgroup_ids, &id))
        return id;
    if (bpf_map_update_elem(&cgroup_ids, &id, &one, BPF_NOEXIST) == 0 || bpf_map_lookup_elem(&cgroup_ids, &id))
        return id;
    return 0;
}

static __always_inline void record(u32 op, u32 pid, const char *comm, u64 cgroup, u64 now, u64 delta,
                                   struct start_val *s, u32 ptr_kind, const char *name)
{
    u64 task_cgroup = comm ? cgroup : bpf_get_current_cgroup_id();
    if (cfg.want_dist) {
        struct dist_key dk = {.op = op, .slot = log2l(delta / cfg.dist_unit_ns)};
        struct total_key tk = {.op = op};
        struct op_total none = {};
        struct op_total *total;
        u64 zero = 0, *n;
        if (cfg.want_dev) {
            dk.dev = (u32)s->dev;
            tk.dev = (u32)s->dev;
        }
        if (cfg.want_cgroup_key) {
            dk.cgroup = admitted_cgroup(task_cgroup);
            tk.cgroup = dk.cgroup;
        }
        n = bpf_map_lookup_elem(&dist, &dk);
        if (!n) {
            bpf_map_update_elem(&dist, &dk, &zero, BPF_NOEXIST);
            n = bpf_map_lookup_elem(&dist, &dk);
        }
        if (n)
            __sync_fetch_and_add(n, 1);
        else
            count(&untimed, op);  /* a full histogram map: counted, never dropped unseen */
        total = bpf_map_lookup_elem(&op_totals, &tk);
        if (!total) {
            bpf_map_update_elem(&op_totals, &tk, &none, BPF_NOEXIST);
            total = bpf_map_lookup_elem(&op_totals, &tk);
        }
        if (total) {
            __sync_fetch_and_add(&total->bytes, s->bytes);
            if (cfg.want_lat_sum)
                __sync_fetch_and_add(&total->lat_ns, delta);
        }
    }
    if (cfg.want_top) {
        struct top_key tk = {.tgid = pid, .op = op};
        struct top_hist_key hk = {.tgid = pid, .op = op, .slot = log2l(delta / 1000)};
        struct top_val zero = {};
        struct top_val *tv;
        u64 one = 1, *hn;
        if (cfg.want_dev) {
            tk.dev = (u32)s->dev;
            hk.dev = (u32)s->dev;
        }
        tv = bpf_map_lookup_elem(&top_stats, &tk);
        if (!tv) {
            bpf_map_update_elem(&top_stats, &tk, &zero, BPF_NOEXIST);
            tv = bpf_map_lookup_elem(&top_stats, &tk);
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
        hn = bpf_map_lookup_elem(&top_hist, &hk);
        if (hn)
            __sync_fetch_and_add(hn, 1);
        else
            bpf_map_update_elem(&top_hist, &hk, &one, BPF_NOEXIST);
    }
    if (cfg.want_events && delta >= cfg.min_lat_ns) {
        struct event *e = bpf_ringbuf_reserve(&events, sizeof(struct event), 0);
        if (!e) {
            count(&lost_events, 0);
            return;
        }
        fill_event(e, op, pid, comm, task_cgroup, now, delta, s, ptr_kind, name);
        bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
}

static __always_inline int sane_delta(u64 start, u64 now)
{
    if (start == 0 || now < start || now - start > MAX_LAT_NS) {
        count(&anomalies, 0);
        return 0;
    }
    return 1;
}

/* end of a same-thread operation; bytes_at_end >= 0 replaces the entry's byte count */
static __always_inline void task_end(u32 point, s64 bytes_at_end, const char *name)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 op = cfg.points[point].op;
    u32 slot = cfg.points[point].slot;
    u32 user_id = cfg.points[point].id;
    struct start_val s = {};
    u64 now = bpf_ktime_get_ns();
    int held = 0;
    if (cfg.want_inflight)
        held = inflight_end(id, user_id, &s);
    if (!held) {
        if (cfg.task_storage) {
            struct start_val *found;
            struct task_starts *t = bpf_task_storage_get(&task_starts, bpf_get_current_task_btf(), 0,
                                                         BPF_LOCAL_STORAGE_GET_F_CREATE);
            if (!t || slot >= NSLOTS) {
                count(&untimed, op);
                return;
            }
            found = &t->at[slot];
            if (found->ts == 0)
                return;
            s = *found;
            found->ts = 0;
        } else {
            struct start_key k = {.tid = (u32)id, .point = user_id};
            struct start_val *found = bpf_map_lookup_elem(&starts, &k);
            if (!found)
                return;
            s = *found;
            bpf_map_delete_elem(&starts, &k);
        }
    }
    if (!sane_delta(s.ts, now))
        return;
    if (bytes_at_end >= 0)
        s.bytes = bytes_at_end;
    record(op, (u32)(id >> 32), 0, 0, now, now - s.ts, &s, cfg.points[point].ptr_kind, name);
}

static __always_inline void async_start(struct async_key *k, u32 op, struct start_val *s, const char *name)
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
    if (bpf_map_update_elem(&async_starts, k, &v, BPF_ANY))
        count(&untimed, op);
}

static __always_inline void async_end(struct async_key *k, u32 op, s64 bytes_at_end)
{
    struct async_val *found = bpf_map_lookup_elem(&async_starts, k);
    struct async_val v;
    u64 now;
    if (!found)
        return;
    now = bpf_ktime_get_ns();
    v = *found;
    bpf_map_delete_elem(&async_starts, k);
    if (!sane_delta(v.s.ts, now))
        return;
    if (bytes_at_end >= 0)
        v.s.bytes = bytes_at_end;
    record(op, v.pid, v.comm, v.cgroup, now, now - v.s.ts, &v.s, PTR_NONE,
           v.name[0] ? v.name : 0);
}

/* the start of a same-thread function point: its file or dentry and offset from the
 * parameters the loader named (cfg.points[].arg), the mount where the tool needs it now */
static __always_inline void function_start(u32 point, u64 ptr_arg, u64 offset_arg)
{
    struct start_val v = {};
    if (cfg.points[point].arg[ARG_PTR].param != NO_PARAM)
        v.ptr = follow(ptr_arg, point, ARG_PTR);
    if (cfg.points[point].arg[ARG_OFFSET].param != NO_PARAM)
        v.offset = follow(offset_arg, point, ARG_OFFSET);
    if (cfg.dev_at_entry && v.ptr)
        v.dev = dev_of(v.ptr, cfg.points[point].ptr_kind);
    task_start(point, &v);
}

static __always_inline void tp_start(void *ctx, u32 point)
{
    struct start_val v = {};
    v.fileid = tp_field(ctx, point, TP_FILEID);
    v.offset = tp_field(ctx, point, TP_OFFSET);
    v.bytes = tp_field(ctx, point, TP_BYTES);
    v.dev = tp_field(ctx, point, TP_DEV);
    if (cfg.points[point].keyed) {
        struct async_key k = {.point = cfg.points[point].id};
        for (int i = 0; i < NKEYS; i++)
            k.k[i] = tp_field(ctx, point, TP_KEY0 + i);
        async_start(&k, cfg.points[point].op, &v, tp_string(ctx, point, TP_NAME));
    } else {
        task_start(point, &v);
    }
}

static __always_inline void tp_end(void *ctx, u32 point)
{
    s64 bytes = cfg.points[point].tp[TP_EXIT_BYTES].size ? tp_field(ctx, point, TP_EXIT_BYTES) : -1;
    if (cfg.points[point].keyed) {
        struct async_key k = {.point = cfg.points[point].id};
        for (int i = 0; i < NKEYS; i++)
            k.k[i] = tp_field(ctx, point, TP_EXIT_KEY0 + i);
        if (cfg.points[point].watch)  /* tracked in flight only: nothing recorded */
            bpf_map_delete_elem(&async_starts, &k);
        else
            async_end(&k, cfg.points[point].op, bytes);
    } else {
        task_end(point, bytes, tp_string(ctx, point, TP_EXIT_NAME));
    }
}

/* generated programs follow */
