/* ratecount: how often each allocator entry point is called — a bounded count on one uprobe per
 * entry point, so the engine can price full allocation tracing before committing to it. Each
 * site has a program of its own (count_site_<slot>) adding to its slot of `calls`: the loader
 * assigns the slots, so no number here means anything to Python beyond "slot N of calls". The
 * loader detaches as soon as a count passes its bound, hottest site first, so a hot allocator pays
 * for a few thousand traps, not for a second. */
#include "memdiag.h"

BPF_ARRAY(calls, u64, 16);

static __always_inline int count(int slot)
{
	calls.increment(slot);
	return 0;
}

/* bcc rewrites map calls only outside macros: the macro holds the call to count() alone. */
#define SITE(n) \
	int count_site_##n(struct pt_regs *ctx) { return count(n); }

SITE(0)
SITE(1)
SITE(2)
SITE(3)
SITE(4)
SITE(5)
SITE(6)
SITE(7)
SITE(8)
SITE(9)
SITE(10)
SITE(11)
SITE(12)
SITE(13)
SITE(14)
SITE(15)
