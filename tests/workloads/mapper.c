/* Grows memory by the two system calls behind the allocator: grow_heap_with_brk() extends the
 * heap with sbrk(), map_buffers() maps anonymous regions with mmap(). Each touches what it gets.
 * usage: mapper [brk_KiB_per_tick=256] [mmap_KiB_per_tick=512] (10 ticks a second) */
#include "common.h"
#include <sys/mman.h>

__attribute__((noinline)) void grow_heap_with_brk(size_t bytes)
{
	char *p = sbrk((intptr_t)bytes);
	if (p != (void *)-1)
		memset(p, 1, bytes);
}

__attribute__((noinline)) void map_buffers(size_t bytes)
{
	char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED)
		memset(p, 2, bytes);
}

int main(int argc, char **argv)
{
	long brk_kib = arg_long(argc, argv, 1, 256);
	long mmap_kib = arg_long(argc, argv, 2, 512);

	ready();
	for (;;) {
		if (brk_kib > 0)
			grow_heap_with_brk((size_t)brk_kib << 10);
		if (mmap_kib > 0)
			map_buffers((size_t)mmap_kib << 10);
		sleep_ms(100);
	}
}
