/* probekit's bcc layer: how bcc spells what bpf/probe.bpf.c asks of its loader.
 *
 * bcc compiles the probe at start-up for the points chosen on this kernel, so every setting
 * is a constant probes/generate.py defines (CFG_x, P_<point>_x, SIZE_<map>) and the compiler
 * drops what a tool does not use. Struct members are read at byte offsets from the running
 * kernel's BTF (OFF_*): a kernel header costs seconds of compile under emulation. Maps are bcc's tables, used through the methods bcc rewrites.
 */
#include <uapi/linux/ptrace.h>

#define CFG(name) CFG_##name
/* point p's setting: P_<p>_<name>, chosen by generate.point_selectors (p is a constant once the
 * probe's functions are inlined) */
#define P(point, name) P_##name(point)
#define SIZE(map) SIZE_##map
#define FLAGS(map) FLAGS_##map

#define MAP_HASH(name, K, V, n) BPF_TABLE("hash", K, V, name, n)
#define MAP_HASH_FLAGS(name, K, V, n, flags) BPF_F_TABLE("hash", K, V, name, n, flags)
#define MAP_ARRAY(name, V, n) BPF_TABLE("array", int, V, name, n)
#define MAP_CGROUP_ARRAY(name, n) BPF_CGROUP_ARRAY(name, n)
/* a ring buffer: kernel 5.8, bcc 0.16 */
#define MAP_RINGBUF(name, bytes) BPF_RINGBUF_OUTPUT(name, (bytes) / 4096)
/* The operations on them (MAP_LOOKUP and the like) are not macros here: bcc's rewriter takes
 * a map's methods only where they stand in the text, so probes/generate.py writes each as the
 * method it is (`.lookup(...)` on the map) before bcc compiles the text. */

/* task local storage for tracing programs: kernel 5.11, bcc 0.24 (else the hash `starts`,
 * and the calls on task storage, compiled out, are spelled NO_TASK_STORAGE) */
#if CFG_task_storage
#define MAP_TASK_STORAGE(name, V) BPF_TASK_STORAGE(name, V)
#else
#define MAP_TASK_STORAGE(name, V) struct task_storage_absent
#define NO_TASK_STORAGE(...) ((struct task_starts *)0)
#endif

/* the struct members the probe follows, at this kernel's BTF offsets (OFF_x; -1 where its BTF
 * did not give one: the read is then 0) */
#define MEMBER(base, off) ((off) >= 0 ? read_ptr((base) + (off)) : 0)
#define file_sb(file) MEMBER(MEMBER(file, OFF_FILE_INODE), OFF_INODE_SB)
#define file_ino(file) MEMBER(MEMBER(file, OFF_FILE_INODE), OFF_INODE_INO)
#define file_dentry(file) MEMBER(file, OFF_FILE_PATH_DENTRY)
#define dentry_sb(dentry) MEMBER(dentry, OFF_DENTRY_SB)
#define dentry_name_ptr(dentry) MEMBER(dentry, OFF_DENTRY_NAME)
#define sb_dev(sb) ((u32)MEMBER(sb, OFF_SB_DEV))

/* What the current thread entered the kernel for: the system call number (orig_ax of the
 * registers it entered with; an exception's error code; 0 for kernel threads). Before 5.15
 * (no bpf_task_pt_regs) every start counts as of one call. */
static __always_inline s64 current_call(void)
{
    s64 call = 0;
#if CFG_task_storage && LINUX_VERSION_CODE >= KERNEL_VERSION(5, 15, 0)
    char *regs = (char *)bpf_task_pt_regs(bpf_get_current_task_btf());
    bpf_probe_read_kernel(&call, sizeof(call), regs + __builtin_offsetof(struct pt_regs, orig_ax));
#endif
    return call;
}

/* parameter n of a kprobe's function (x86-64 registers), 0 past the sixth */
static __always_inline u64 kprobe_param(struct pt_regs *ctx, u64 n)
{
    switch (n) {
    case 0: return PT_REGS_PARM1(ctx);
    case 1: return PT_REGS_PARM2(ctx);
    case 2: return PT_REGS_PARM3(ctx);
    case 3: return PT_REGS_PARM4(ctx);
    case 4: return PT_REGS_PARM5(ctx);
    case 5: return PT_REGS_PARM6(ctx);
    }
    return 0;
}

#define kprobe_ret(ctx) ((s64)PT_REGS_RC(ctx))
/* a trampoline's context is the arguments, then (fexit) the return value */
#define fentry_arg(ctx, p, name) ((u64)(ctx)[P(p, name)])
#define fexit_ret(ctx, p) ((s64)(ctx)[P(p, nargs)])

/* bcc finds programs by their names (kfunc__MODULE__FUNCTION attaches itself; probes.bcc_backend
 * attaches the others by name), not by section */
#define PROGRAM(name, section, ...) int name(__VA_ARGS__)
