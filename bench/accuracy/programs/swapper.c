/* A working set larger than its cgroup's memory: MIB MiB touched at random, page by page, for ever
 * (with swap, the pages it needs come back from swap). swapper MIB */
#include "acc.h"

__attribute__((noinline)) static long touch_working_set(char *set, long pages, long n)
{
	long page = (n * 2654435761u) % pages;
	set[page * 4096] += 1;
	return set[page * 4096];
}

int main(int argc, char **argv)
{
	long mib = arg(argc, argv, 1, 160), pages = mib * 256;
	char *set = malloc(mib << 20);
	memset(set, 1, mib << 20);
	volatile long sink = 0;
	say_ready();
	for (long n = 0;; n++) {
		sink += touch_working_set(set, pages, n);
		if (n % 2000 == 0)
			nap_ms(1);
	}
}
