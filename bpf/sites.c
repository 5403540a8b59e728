/* sites: the blocks one function's own calls to the allocator return (narrowed allocation tracing).
 *
 * A uprobe just after each such call (probes/memleak/callsites.py finds them): rax holds the block
 * and the caller's frame is on top of the stack. Nothing else traps, neither malloc nor free, so a
 * hot allocator pays only for the calls of the function a page-fault profile named. The block's
 * size, and whether it is still allocated, are read later from the allocator's own chunk headers
 * (probes/memleak/glibcheap.py): free is not traced.
 * Per block: its stack key and time. Per stack key: its calls (so "1 in N calls leaks" is per stack),
 * the first event's registers and a copy of the user stack, so user space unwinds frameless code
 * with .eh_frame (as faults.c).
 * Defines from the loader: MAX_BLOCKS, MAX_SAMPLES. */
#include "memdiag.h"

#ifndef MAX_BLOCKS
#define MAX_BLOCKS 65536
#endif
#ifndef MAX_STACKS
#define MAX_STACKS 1024
#endif
#ifndef MAX_SAMPLES
#define MAX_SAMPLES 256
#endif

struct site_key {
	u32 tgid;
	s32 stack_id;
	u64 ip; /* the site: the instruction after the call */
	/* No word from the stack: unlike at an allocator's entry (memleak's key, where [sp] is the return
	 * address), [sp] after the call is the caller's own local, a different key for every call of a
	 * loop (the kit's bench_alloc: 1,377 calls, 1,377 keys, the 256 stack copies gone at once). */
};

struct site_block {
	u64 ts_ns;
	struct site_key key;
};

/* what user space reads of stats, by index: probes/memleak/sites.py STAT_NAMES, in this order */
enum site_stat { SS_HITS, SS_NULL, SS_STACK_ERRORS, SS_BLOCKS_DROPPED, SS_SAMPLES_DROPPED, SS_CALLS_DROPPED, SS_COUNT };

BPF_F_TABLE("hash", u64, struct site_block, blocks, MAX_BLOCKS, BPF_F_NO_PREALLOC);
BPF_STACK_TRACE(stacks, MAX_STACKS);
BPF_F_TABLE("hash", struct site_key, struct stack_sample, samples, MAX_SAMPLES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct site_key, u64, calls, MAX_SAMPLES, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_ARRAY(stats, u64, SS_COUNT);

int site_return(struct pt_regs *ctx)
{
	u64 addr = PT_REGS_RC(ctx);
	stats.increment(SS_HITS);
	if (addr == 0) {
		stats.increment(SS_NULL); /* the allocation failed: nothing to follow */
		return 0;
	}
	int zero = 0;
	struct stack_sample *s = scratch.lookup(&zero);
	if (!s)
		return 0;
	uprobe_regs(&s->regs, ctx);
	struct site_block b = { .ts_ns = bpf_ktime_get_ns() };
	b.key.tgid = current_pid_tgid() >> 32;
	b.key.ip = s->regs.ip;
	b.key.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (b.key.stack_id < 0)
		stats.increment(SS_STACK_ERRORS);
	u64 one = 1, *n = calls.lookup(&b.key);
	if (n)
		__sync_fetch_and_add(n, 1);
	else if (calls.insert(&b.key, &one) != 0)
		stats.increment(SS_CALLS_DROPPED);
	if (!samples.lookup(&b.key)) {
		copy_user_stack(s);
		if (samples.insert(&b.key, s) != 0)
			stats.increment(SS_SAMPLES_DROPPED);
	}
	/* an address seen again was freed and handed out again since: the newer call owns it */
	if (blocks.update(&addr, &b) != 0)
		stats.increment(SS_BLOCKS_DROPPED);
	return 0;
}
