/* Shared between memdiag's BPF programs and their loaders: the structs both sides read and the
 * helpers that touch no map (bcc rewrites map calls only in the main file, so maps and their
 * lookups stay in each probe's .c).
 *
 * Options arrive as -D defines from the loader (cflags):
 *   TARGET_MODE    0 = every process, 1 = only the tgids in the probe's `targets` map
 *   STACK_CHUNKS   user stack copied per sampled stack, in 512-byte chunks (default 16 = 8 KiB)
 *   PIDNS_DEV, PIDNS_INO  the pid namespace /proc numbers processes in, when it is not the initial
 *                  one (memdiag in a container): ids are then given in it (current_pid_tgid)
 */
#ifndef MEMDIAG_H
#define MEMDIAG_H

#include <uapi/linux/ptrace.h>

/* The kernel's comm size (include/linux/sched.h), without including that header: it pulls in
 * most of the kernel's headers and costs bcc's compiler ~17 MiB and ~0.3 s per program. */
#ifndef TASK_COMM_LEN
#define TASK_COMM_LEN 16
#endif

#ifndef TARGET_MODE
#define TARGET_MODE 0
#endif
#ifndef STACK_CHUNKS
#define STACK_CHUNKS 16
#endif
#define STACK_CHUNK 512
#define STACK_BYTES (STACK_CHUNKS * STACK_CHUNK)

/* The current task's tgid (high half) and pid as memdiag's /proc numbers them. In a pid
 * namespace of memdiag's own, bpf_get_current_pid_tgid() would give the host's numbers, which
 * match no pid memdiag knows; a task outside that namespace gets 0 (no target has tgid 0). */
static __always_inline u64 current_pid_tgid(void)
{
#if defined(PIDNS_DEV) && defined(PIDNS_INO)
	struct bpf_pidns_info ns = {};
	if (bpf_get_ns_current_pid_tgid(PIDNS_DEV, PIDNS_INO, &ns, sizeof(ns)) != 0)
		return 0;
	return ((u64)ns.tgid << 32) | ns.pid;
#else
	return bpf_get_current_pid_tgid();
#endif
}

struct user_regs {
	u64 ip;
	u64 sp;
	u64 bp;
};

/* Registers and a copy of the user stack from sp, taken once per new stack key, so user space
 * can unwind frameless code (glibc, libstdc++) with .eh_frame. */
struct stack_sample {
	struct user_regs regs;
	u32 len; /* bytes of data[] that were readable */
	u32 pad;
	u8 data[STACK_BYTES];
};

/* Copy as much of the user stack from sp as is mapped: stop at the first chunk that cannot be
 * read (the top of the stack mapping is often only a few KiB above sp). */
static __always_inline void copy_user_stack(struct stack_sample *s)
{
	s->len = 0;
#pragma unroll
	for (int i = 0; i < STACK_CHUNKS; i++) {
		if (bpf_probe_read_user(&s->data[i * STACK_CHUNK], STACK_CHUNK,
					(void *)(s->regs.sp + i * STACK_CHUNK)) != 0)
			break;
		s->len += STACK_CHUNK;
	}
}

/* x86-64 only (memdiag/system/arch.py refuses other machines before anything is compiled): the
 * pt_regs fields below are x86-64's. A system call's arguments, by position (x86-64 syscall ABI). */
#define SYSCALL_ARG2 si
#define SYSCALL_ARG3 dx
#define SYSCALL_ARG4 r10

/* User registers from a struct pt_regs in kernel memory (raw tracepoint arguments). ip, sp and
 * bp sit at the same offsets in every x86-64 kernel's pt_regs (FRED in 6.9 changed only cs/ss). */
static __always_inline void read_user_regs(struct user_regs *r, struct pt_regs *regs)
{
	bpf_probe_read_kernel(&r->ip, sizeof(r->ip), &regs->ip);
	bpf_probe_read_kernel(&r->sp, sizeof(r->sp), &regs->sp);
	bpf_probe_read_kernel(&r->bp, sizeof(r->bp), &regs->bp);
}

#endif
