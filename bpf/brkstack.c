/* brkstack: heap growth — brk() calls by user stack, with the bytes each one grew the heap.
 *
 * On the raw syscall tracepoints (their arguments carry the user pt_regs, so the stack can be
 * unwound through glibc's frameless sbrk/sysmalloc with .eh_frame in user space). The loader
 * passes the syscall number (NR_BRK) and seeds each target's current break in `last_brk`.
 * Map lookups stay in this file: bcc rewrites them only in the main source. */
#include "memdiag.h"

struct grow_key {
	u32 tgid;
	s32 stack_id;
	u64 ip;
	u64 at_sp;
};

struct grow_val {
	u64 calls;
	u64 bytes;
};

BPF_HASH(targets, u32, u8, 4096);
BPF_HASH(last_brk, u32, u64, 4096); /* tgid -> program break after its last brk() */
BPF_HASH(inflight, u32, struct grow_key, 4096); /* tid -> key of the brk() in progress */
BPF_STACK_TRACE(stacks, 4096);
BPF_HASH(counts, struct grow_key, struct grow_val, 4096);
BPF_F_TABLE("hash", struct grow_key, struct stack_sample, samples, 512, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_ARRAY(stats, u64, STACK_ST_COUNT);

RAW_TRACEPOINT_PROBE(sys_enter)
{
	if (ctx->args[1] != NR_BRK)
		return 0;
	u64 id = current_pid_tgid();
	u32 tgid = id >> 32, tid = id;
#if TARGET_MODE == 1
	if (!targets.lookup(&tgid))
		return 0;
#endif
	int zero = 0;
	struct stack_sample *s = scratch.lookup(&zero);
	if (!s)
		return 0;
	read_user_regs(&s->regs, (struct pt_regs *)ctx->args[0]);
	struct grow_key key = { .tgid = tgid, .ip = s->regs.ip };
	key.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (key.stack_id < 0)
		stats.increment(STACK_ST_STACK_ERRORS);
	bpf_probe_read_user(&key.at_sp, sizeof(key.at_sp), (void *)s->regs.sp);
	inflight.update(&tid, &key);
	if (!samples.lookup(&key)) {
		copy_user_stack(s);
		if (samples.insert(&key, s) != 0)
			stats.increment(STACK_ST_SAMPLES_DROPPED);
	}
	return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
	u32 tid = current_pid_tgid();
	struct grow_key *key = inflight.lookup(&tid);
	if (!key)
		return 0;
	struct grow_key k = *key;
	inflight.delete(&tid);
	u64 ret = ctx->args[1]; /* the new break (the old one when brk() failed) */
	u64 grew = 0, *last = last_brk.lookup(&k.tgid);
	if (last && ret > *last)
		grew = ret - *last;
	last_brk.update(&k.tgid, &ret);
	stats.increment(STACK_ST_EVENTS);
	struct grow_val zero = {}, *v = counts.lookup_or_try_init(&k, &zero);
	if (!v) {
		stats.increment(STACK_ST_KEYS_DROPPED);
		return 0;
	}
	__sync_fetch_and_add(&v->calls, 1);
	__sync_fetch_and_add(&v->bytes, grew);
	return 0;
}
