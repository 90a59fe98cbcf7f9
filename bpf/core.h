/* probekit's CO-RE layer: how libbpf's form spells what bpf/probe.bpf.c asks of its loader.
 *
 * The object is compiled once, where the package is built, for kernels nobody has seen yet: it
 * holds every candidate attach point of a spec as programs of its own (the loader autoloads
 * the chosen ones); every setting is an instruction's immediate the loader writes into each
 * chosen program before loading (SETTING below); kernel structs are read through CO-RE
 * relocations on the minimal definitions below; maps are sized by the loader (SIZE and FLAGS
 * are placeholders).
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

char LICENSE[] SEC("license") = "GPL";

/* A setting, as bcc's text has it: a constant in the instruction stream. The object holds one
 * 64-bit immediate load per use, whose value marks the place: CFG_MARK in the upper half, the
 * setting's byte offset in `struct cfg` << 8 | its size in the lower; the loader replaces it with
 * the setting's value (probes.generate_core.settings_inlined). The verifier then knows every
 * value and prunes what a setting turns off, and the program reads no setting from memory.
 * Volatile: each use keeps its own load, which the compiler cannot fold or merge. */
#define SETTING(off, size) \
    ({ \
        u64 v_; \
        asm volatile("%0 = %1 ll" : "=r"(v_) : "i"(((u64)CFG_MARK << 32) | ((u64)(off) << 8) | (size))); \
        v_; \
    })
#define CFG(name) SETTING(__builtin_offsetof(struct cfg, name), sizeof(((struct cfg *)0)->name))
/* point may be a function's parameter: every caller passes a constant, and the immediate is
 * computed once the function is inlined */
#define P(point, name) SETTING(__builtin_offsetof(struct cfg, points[point].name), sizeof(u32))
#define SIZE(map) 1
#define FLAGS(map) 0

#define MAP_DEF(map_type, name, K, V, n, flags) \
    struct { \
        __uint(type, map_type); \
        __uint(max_entries, n); \
        __uint(map_flags, flags); \
        __type(key, K); \
        __type(value, V); \
    } name SEC(".maps")
#define MAP_HASH(name, K, V, n) MAP_DEF(BPF_MAP_TYPE_HASH, name, K, V, n, 0)
#define MAP_HASH_FLAGS(name, K, V, n, flags) MAP_DEF(BPF_MAP_TYPE_HASH, name, K, V, n, flags)
#define MAP_ARRAY(name, V, n) MAP_DEF(BPF_MAP_TYPE_ARRAY, name, u32, V, n, 0)
#define MAP_CGROUP_ARRAY(name, n) MAP_DEF(BPF_MAP_TYPE_CGROUP_ARRAY, name, u32, u32, n, 0)
#define MAP_TASK_STORAGE(name, V) MAP_DEF(BPF_MAP_TYPE_TASK_STORAGE, name, int, V, 0, BPF_F_NO_PREALLOC)
#define MAP_RINGBUF(name, bytes) \
    struct { \
        __uint(type, BPF_MAP_TYPE_RINGBUF); \
        __uint(max_entries, bytes); \
    } name SEC(".maps")
#define MAP_LOOKUP(map, key) bpf_map_lookup_elem(&map, key)
#define MAP_UPDATE(map, key, value) bpf_map_update_elem(&map, key, value, BPF_ANY)
#define MAP_INSERT(map, key, value) bpf_map_update_elem(&map, key, value, BPF_NOEXIST)
#define MAP_DELETE(map, key) bpf_map_delete_elem(&map, key)
#define MAP_TASK_STORAGE_GET(map, task, value, flags) bpf_task_storage_get(&map, task, value, flags)
#define MAP_UNDER_CGROUP(map, index) bpf_current_task_under_cgroup(&map, index)
#define MAP_RINGBUF_RESERVE(map, size) bpf_ringbuf_reserve(&map, size, 0)
#define MAP_RINGBUF_SUBMIT(map, record, flags) bpf_ringbuf_submit(record, flags)

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

static __always_inline u64 file_sb(u64 file)
{
    return (u64)BPF_CORE_READ((struct file *)file, f_inode, i_sb);
}

static __always_inline u64 dentry_sb(u64 dentry)
{
    return (u64)BPF_CORE_READ((struct dentry *)dentry, d_sb);
}

static __always_inline u64 sb_dev(u64 sb)
{
    return BPF_CORE_READ((struct super_block *)sb, s_dev);
}

static __always_inline u64 file_dentry(u64 file)
{
    return (u64)BPF_CORE_READ((struct file *)file, f_path.dentry);
}

static __always_inline u64 dentry_name_ptr(u64 dentry)
{
    return (u64)BPF_CORE_READ((struct dentry *)dentry, d_name.name);
}

static __always_inline u64 file_ino(u64 file)
{
    return BPF_CORE_READ((struct file *)file, f_inode, i_ino);
}

/* What the current thread entered the kernel for: the system call number (orig_ax of the
 * registers it entered with; an exception's error code; 0 for kernel threads). */
static __always_inline s64 current_call(void)
{
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    return (s64)regs->orig_ax;  /* a BTF pointer: read in place, no helper call */
}

/* parameter n of a kprobe's function (x86-64 calling convention), 0 past the sixth */
static __always_inline u64 kprobe_param(struct pt_regs *ctx, u64 n)
{
    u64 val = 0;
    u32 off;
    switch (n) {
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

/* A trampoline's context is its function's arguments (up to 12 on x86-64), then (fexit) the
 * return value: slot n is one load at offset 8n, as a program written for the prototype reads
 * it (the verifier refuses a context load at a computed offset). n is a setting: the object
 * holds a placeholder like SETTING's, marked CTX_MARK, before a load at offset 0, and the
 * loader writes 8n into the load's offset and turns the placeholder into two no-op jumps, which
 * the verifier removes (probes.generate_core.settings_inlined). */
#define CTX_SLOT(ctx, off) \
    ({ \
        u64 v_, m_; \
        asm volatile("%0 = %2 ll\n\t%1 = *(u64 *)(%3 + 0)" \
                     : "=&r"(m_), "=r"(v_) \
                     : "i"(((u64)CTX_MARK << 32) | ((u64)(off) << 8) | sizeof(u32)), "r"(ctx)); \
        v_; \
    })

/* the parameter that point p's setting `name` numbers, and the return value (after its nargs) */
#define fentry_arg(ctx, p, name) CTX_SLOT(ctx, __builtin_offsetof(struct cfg, points[p].name))
#define fexit_ret(ctx, p) ((s64)CTX_SLOT(ctx, __builtin_offsetof(struct cfg, points[p].nargs)))

#define PROGRAM(name, section, ...) SEC(section) int name(__VA_ARGS__)
