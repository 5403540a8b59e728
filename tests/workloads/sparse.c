/* Page tables that grow with a process's mappings: touch_sparse() touches one page in every 2 MiB
 * of a large anonymous reservation, so each touched page costs a page of page tables besides
 * itself: VmPTE grows as fast as RSS, kernel memory RSS does not count.
 * usage: sparse [pages_per_second=2000] [reserve_gib=64] */
#include "common.h"
#include <sys/mman.h>

__attribute__((noinline)) void touch_sparse(char *base, long i)
{
	base[i * (2L << 20)] = 1;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 2000), gib = arg_long(argc, argv, 2, 64);
	long slots = gib * 512;
	char *base = mmap(NULL, gib << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return 1;
	madvise(base, gib << 30, MADV_NOHUGEPAGE);
	ready();
	for (long i = 0; i < slots; i++) {
		touch_sparse(base, i);
		if (i % (rate / 100 ? rate / 100 : 1) == 0)
			sleep_ms(10);
	}
	for (;;)
		sleep_ms(1000);
}
