/* faults: page faults by user stack, i.e. where RSS grows.
 *
 * On the raw tracepoint exceptions:page_fault_user (its arguments carry the user pt_regs, which
 * the classic tracepoint does not expose). Counts aggregate in the kernel per (tgid, frame-pointer
 * stack, ip, word at sp); the first event of each key also saves registers and a copy of the user
 * stack so user space can unwind frameless library code with .eh_frame.
 * Without a target (TARGET_MODE 0 and PER_PROCESS 1) it only counts faults per process.
 * PY_FRAMES 1: the Python stack of processes in py_procs is part of the key (bpf/pyframes.h). */
#include "memdiag.h"
#include "pyframes.h"

#ifndef PER_PROCESS
#define PER_PROCESS 0
#endif
#ifndef MAX_KEYS
#define MAX_KEYS 10240
#endif
#ifndef MAX_STACKS
#define MAX_STACKS 2048
#endif
#ifndef MAX_SAMPLES
#define MAX_SAMPLES 1024
#endif

struct fault_key {
	u32 tgid;
	s32 stack_id;
	u64 ip;
	u64 at_sp; /* the word at sp: the caller of a frameless leaf */
};

struct proc_key {
	u32 tgid;
	char comm[TASK_COMM_LEN];
};

BPF_HASH(targets, u32, u8, 4096);
BPF_STACK_TRACE(stacks, MAX_STACKS); /* preallocated: ~1 KiB a slot */
BPF_HASH(counts, struct fault_key, u64, MAX_KEYS);
BPF_HASH(per_process, struct proc_key, u64, MAX_KEYS);
/* Grows with use: a sample is 8 KiB, so only what is seen is paid for. */
BPF_F_TABLE("hash", struct fault_key, struct stack_sample, samples, MAX_SAMPLES, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_ARRAY(stats, u64, STACK_ST_COUNT);
#if PY_FRAMES
/* py_procs, py_threads, py_scratch and py_now(): spliced in by probes/compiler.py (bpf/pynow.h) */
#include "pynow.h"
/* the Python stack of each key, recorded with its first stack copy */
BPF_F_TABLE("hash", struct fault_key, struct py_stack, pystacks, MAX_SAMPLES, BPF_F_NO_PREALLOC);
#endif

RAW_TRACEPOINT_PROBE(page_fault_user)
{
	u64 id = current_pid_tgid();
	u32 tgid = id >> 32;
#if TARGET_MODE == 1
	if (!targets.lookup(&tgid))
		return 0;
#endif
	stats.increment(STACK_ST_EVENTS);
#if PER_PROCESS
	struct proc_key pk = { .tgid = tgid };
	bpf_get_current_comm(&pk.comm, sizeof(pk.comm));
	u64 zero64 = 0, *n = per_process.lookup_or_try_init(&pk, &zero64);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
#else
	int zero = 0;
	struct stack_sample *s = scratch.lookup(&zero);
	if (!s)
		return 0;
	read_user_regs(&s->regs, (struct pt_regs *)ctx->args[1]);
	struct fault_key key = { .tgid = tgid, .ip = s->regs.ip };
	key.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (key.stack_id < 0)
		stats.increment(STACK_ST_STACK_ERRORS);
	bpf_probe_read_user(&key.at_sp, sizeof(key.at_sp), (void *)s->regs.sp);
#if PY_FRAMES
	struct py_scratch *py = NULL;
	u64 py_hash = py_now(id, &py);
	key.at_sp ^= py_hash; /* one native stack serves many Python call paths */
#endif

	u64 one = 1, *count = counts.lookup(&key);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return 0;
	}
	if (counts.insert(&key, &one) != 0) {
		stats.increment(STACK_ST_KEYS_DROPPED);
		return 0;
	}
	copy_user_stack(s);
	if (samples.insert(&key, s) != 0)
		stats.increment(STACK_ST_SAMPLES_DROPPED);
#if PY_FRAMES
	if (py_hash && py && pystacks.insert(&key, &py->st) != 0)
		stats.increment(STACK_ST_PY_DROPPED);
#endif
	return 0;
#endif
}
