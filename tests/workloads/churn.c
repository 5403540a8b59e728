/* Allocation churn with no growth: mixed sizes allocated and freed at a steady rate.
 * usage: churn [allocs_per_second=200000] */
#include "common.h"

__attribute__((noinline)) void churn_batch(long n, long seed)
{
	void *keep[64];
	for (long i = 0; i < n; i += 64) {
		for (int j = 0; j < 64; j++) {
			size_t sz = 16 + ((seed + i + j) * 2654435761u) % 4096;
			keep[j] = malloc(sz);
			if (keep[j])
				memset(keep[j], 0, 16);
		}
		for (int j = 0; j < 64; j++)
			free(keep[j]);
	}
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 200000);
	long per_tick = rate / 100;
	long seed = 0;

	ready();
	for (;;) {
		churn_batch(per_tick, seed++);
		sleep_ms(10);
	}
}
