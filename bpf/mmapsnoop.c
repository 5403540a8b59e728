/* mmapsnoop: mmap() calls by user stack, with length and the kind of mapping (anonymous or
 * file-backed, private or shared, writable or not), and munmap() per process, so reservations can
 * be told from what becomes resident. Raw syscall tracepoints carry the user pt_regs: the syscall
 * arguments (SYSCALL_ARGn in memdiag.h) and the registers for .eh_frame unwinding.
 * The loader passes NR_MMAP and NR_MUNMAP; PY_FRAMES 1 adds the Python stack of processes in
 * py_procs to the key (bpf/pyframes.h). */
#include <uapi/linux/mman.h>
#include "memdiag.h"
#include "pyframes.h"

struct map_key {
	u32 tgid;
	s32 stack_id;
	u64 ip;
	u64 at_sp;
	u32 kind; /* bit 0 file-backed, bit 1 shared, bit 2 writable */
	u32 pad;
};

struct map_val {
	u64 calls;
	u64 bytes;
};

struct unmap_val {
	u64 calls;
	u64 bytes;
};

BPF_HASH(targets, u32, u8, 4096);
BPF_STACK_TRACE(stacks, 4096);
BPF_HASH(counts, struct map_key, struct map_val, 4096);
BPF_HASH(unmaps, u32, struct unmap_val, 4096);
BPF_F_TABLE("hash", struct map_key, struct stack_sample, samples, 512, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_ARRAY(stats, u64, STACK_ST_COUNT);
#if PY_FRAMES
/* py_procs, py_threads, py_scratch and py_now(): spliced in by probes/compiler.py (bpf/pynow.h) */
#include "pynow.h"
/* the Python stack of each key, recorded with its first stack copy */
BPF_F_TABLE("hash", struct map_key, struct py_stack, pystacks, 512, BPF_F_NO_PREALLOC);
#endif

RAW_TRACEPOINT_PROBE(sys_enter)
{
	u64 nr = ctx->args[1];
	if (nr != NR_MMAP && nr != NR_MUNMAP)
		return 0;
	u64 id = current_pid_tgid();
	u32 tgid = id >> 32;
#if TARGET_MODE == 1
	if (!targets.lookup(&tgid))
		return 0;
#endif
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	u64 len = 0;
	bpf_probe_read_kernel(&len, sizeof(len), &regs->SYSCALL_ARG2); /* length */
	if (nr == NR_MUNMAP) {
		struct unmap_val zero = {}, *u = unmaps.lookup_or_try_init(&tgid, &zero);
		if (u) {
			__sync_fetch_and_add(&u->calls, 1);
			__sync_fetch_and_add(&u->bytes, len);
		}
		return 0;
	}
	u64 prot = 0, flags = 0;
	bpf_probe_read_kernel(&prot, sizeof(prot), &regs->SYSCALL_ARG3);
	bpf_probe_read_kernel(&flags, sizeof(flags), &regs->SYSCALL_ARG4);
	int zero_i = 0;
	struct stack_sample *s = scratch.lookup(&zero_i);
	if (!s)
		return 0;
	read_user_regs(&s->regs, regs);
	struct map_key key = { .tgid = tgid, .ip = s->regs.ip };
	key.kind = ((flags & MAP_ANONYMOUS) ? 0 : 1) | ((flags & MAP_SHARED) ? 2 : 0) | ((prot & PROT_WRITE) ? 4 : 0);
	key.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (key.stack_id < 0)
		stats.increment(STACK_ST_STACK_ERRORS);
	bpf_probe_read_user(&key.at_sp, sizeof(key.at_sp), (void *)s->regs.sp);
#if PY_FRAMES
	struct py_scratch *py = NULL;
	u64 py_hash = py_now(id, &py); /* which Python line grew pymalloc by an arena */
	key.at_sp ^= py_hash;
#endif
	stats.increment(STACK_ST_EVENTS);
	struct map_val zero = {}, *v = counts.lookup(&key);
	if (!v) {
		if (counts.insert(&key, &zero) != 0) {
			stats.increment(STACK_ST_KEYS_DROPPED);
			return 0;
		}
		v = counts.lookup(&key);
		if (!v)
			return 0;
		copy_user_stack(s);
		if (samples.insert(&key, s) != 0)
			stats.increment(STACK_ST_SAMPLES_DROPPED);
#if PY_FRAMES
		if (py_hash && py && pystacks.insert(&key, &py->st) != 0)
			stats.increment(STACK_ST_PY_DROPPED);
#endif
	}
	__sync_fetch_and_add(&v->calls, 1);
	__sync_fetch_and_add(&v->bytes, len);
	return 0;
}
