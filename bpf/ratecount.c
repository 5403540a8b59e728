/* ratecount: how often a function is called — a bounded count on one uprobe, so the engine can
 * price full allocation tracing before committing to it. The loader detaches as soon as the
 * count passes its bound, so a hot allocator pays for a few thousand traps, not for a second. */
#include "memdiag.h"

BPF_ARRAY(calls, u64, 1);

int count_call(struct pt_regs *ctx)
{
	calls.increment(0);
	return 0;
}
