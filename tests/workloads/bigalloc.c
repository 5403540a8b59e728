/* Every allocator entry point, each from its own named function, each keeping what it gets:
 * the memleak probe must name every one. One round per tick; a round allocates through
 * malloc, calloc, realloc (growing a buffer, so the old block moves), reallocarray,
 * posix_memalign, aligned_alloc, memalign, valloc, pvalloc and mmap, plus one 2 MiB block
 * from big_buffer() for the snoop mode. usage: bigalloc [rounds_per_second=10] */
#define _GNU_SOURCE
#include "common.h"
#include <malloc.h>
#include <sys/mman.h>

#define KEEP 4096

static void *kept[16][KEEP];
static long n;

static void keep(int slot, void *p)
{
	if (p && n < KEEP)
		kept[slot][n] = p;
}

__attribute__((noinline)) void *via_malloc(void) { return malloc(1000); }
__attribute__((noinline)) void *via_calloc(void) { return calloc(10, 200); }
__attribute__((noinline)) void *via_realloc(void *old) { return realloc(old, 3000 + n * 16); }
__attribute__((noinline)) void *via_reallocarray(void) { return reallocarray(NULL, 30, 100); }
__attribute__((noinline)) void *via_posix_memalign(void)
{
	void *p = NULL;
	return posix_memalign(&p, 64, 4000) == 0 ? p : NULL;
}
__attribute__((noinline)) void *via_aligned_alloc(void) { return aligned_alloc(128, 5120); }
__attribute__((noinline)) void *via_memalign(void) { return memalign(256, 6000); }
__attribute__((noinline)) void *via_valloc(void) { return valloc(7000); }
__attribute__((noinline)) void *via_pvalloc(void) { return pvalloc(8000); }
__attribute__((noinline)) void *via_mmap(void)
{
	void *p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}
__attribute__((noinline)) void *big_buffer(void) { return malloc(2 << 20); }

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 10);
	void *growing = NULL;

	ready();
	for (;;) {
		keep(0, via_malloc());
		keep(1, via_calloc());
		growing = via_realloc(growing); /* one block, moved: only the last size is outstanding */
		keep(3, via_reallocarray());
		keep(4, via_posix_memalign());
		keep(5, via_aligned_alloc());
		keep(6, via_memalign());
		keep(7, via_valloc());
		keep(8, via_pvalloc());
		keep(9, via_mmap());
		if (n % 10 == 0)
			keep(10, big_buffer());
		n++;
		sleep_ms(1000 / (rate > 0 ? rate : 1));
	}
}
