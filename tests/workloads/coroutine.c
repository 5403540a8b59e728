/* A thread running on a stack malloc()ed in the heap (a coroutine, as green-thread runtimes do):
 * its stack pointer is inside [heap], next to other blocks. After keep_after ticks, keep_pair()
 * stores two blocks only in a registry array allocated at start; they must be anchored (the
 * memory below the coroutine's stack pointer is another block's, not dead stack). The other
 * blocks, one a tick, are dropped: leaked.
 * usage: coroutine [keep_after_ticks=300] (10 ms ticks) */
#define _GNU_SOURCE
#include "common.h"
#include <ucontext.h>

static void **registry;
static void *volatile sink;
static ucontext_t main_ctx, co_ctx;
static long keep_after;

__attribute__((noinline)) void keep_pair(void)
{
	registry[0] = malloc(200);
	registry[1] = malloc(300);
}

__attribute__((noinline)) void drop_one(void)
{
	sink = malloc(64);
}

static void coroutine(void)
{
	for (long i = 0;; i++) {
		if (i == keep_after)
			keep_pair();
		drop_one();
		sleep_ms(10);
	}
}

int main(int argc, char **argv)
{
	keep_after = arg_long(argc, argv, 1, 300);
	registry = calloc(64, sizeof(void *));
	char *stack = malloc(64 << 10);
	getcontext(&co_ctx);
	co_ctx.uc_stack.ss_sp = stack;
	co_ctx.uc_stack.ss_size = 64 << 10;
	co_ctx.uc_link = &main_ctx;
	makecontext(&co_ctx, coroutine, 0);
	ready();
	swapcontext(&main_ctx, &co_ctx);
	return 0;
}
