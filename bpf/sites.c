/* sites: the blocks one function's own calls to the allocator return (narrowed allocation tracing).
 *
 * A uprobe just after each such call (probes/memleak/callsites.py finds them): rax holds the block
 * and the caller's frame is on top of the stack. Under glibc nothing else traps, neither malloc nor
 * free, so a hot allocator pays only for the calls of the function a page-fault profile named. The
 * block's size, and whether it is still allocated, are read later from glibc's chunk headers
 * (probes/memleak/glibcheap.py).
 * Under another allocator (jemalloc: no header memdiag reads) two more kinds of probe: one on each
 * call instruction keeps the size asked for (site_call_*; the call is emulated, and as rare as the
 * site), and one on each of the allocator's free entry points drops a block it frees (site_free_*,
 * counted apart by whether the kernel emulates the instruction the probe sits on, for the price).
 * That is every free of the process, but the books stay one small table.
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
#ifndef MAX_THREADS
#define MAX_THREADS 4096
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
	u64 size; /* asked for, where a call probe kept it (0: not known, glibc's headers say) */
	struct site_key key;
};

BPF_F_TABLE("hash", u64, struct site_block, blocks, MAX_BLOCKS, BPF_F_NO_PREALLOC);
BPF_STACK_TRACE(stacks, MAX_STACKS);
BPF_F_TABLE("hash", struct site_key, struct stack_sample, samples, MAX_SAMPLES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct site_key, u64, calls, MAX_SAMPLES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u64, u64, asked, MAX_THREADS, BPF_F_NO_PREALLOC); /* thread -> size asked at its call */
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
	u64 id = current_pid_tgid();
	struct site_block b = { .ts_ns = bpf_ktime_get_ns() };
	u64 *size = asked.lookup(&id);
	if (size) {
		b.size = *size;
		asked.delete(&id);
	}
	b.key.tgid = id >> 32;
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

/* At the call instruction: the size asked for, by the callee's arguments (bpf/memleak.c's *_enter). */
static __always_inline int keep_size(u64 size)
{
	u64 id = current_pid_tgid();
	stats.increment(SS_CALL_HITS);
	asked.update(&id, &size);
	return 0;
}

int site_call_rdi(struct pt_regs *ctx) { return keep_size(PT_REGS_PARM1(ctx)); } /* malloc, new, valloc */
int site_call_rsi(struct pt_regs *ctx) { return keep_size(PT_REGS_PARM2(ctx)); } /* realloc, aligned_alloc */
int site_call_rdi_rsi(struct pt_regs *ctx) { return keep_size(PT_REGS_PARM1(ctx) * PT_REGS_PARM2(ctx)); } /* calloc */
int site_call_rsi_rdx(struct pt_regs *ctx) { return keep_size(PT_REGS_PARM2(ctx) * PT_REGS_PARM3(ctx)); } /* reallocarray */

/* On the allocator's free entry points (and realloc's: the block it is handed may move, and is
 * then no longer the traced call's): a traced block freed is dropped from the books. */
static __always_inline int dropped(u64 addr, int counter)
{
	stats.increment(counter);
	if (addr != 0 && blocks.delete(&addr) == 0)
		stats.increment(SS_FREED);
	return 0;
}

int site_free_emulated(struct pt_regs *ctx) { return dropped(PT_REGS_PARM1(ctx), SS_FREES_EMULATED); }
int site_free_stepped(struct pt_regs *ctx) { return dropped(PT_REGS_PARM1(ctx), SS_FREES_STEPPED); }
