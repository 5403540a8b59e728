/* Allocates and touches memory in steps until it holds total_MiB (or is OOM-killed), then
 * keeps re-reading and re-writing all of it, so pages pushed to swap are faulted back in.
 * usage: hog [total_MiB=256] [step_MiB=8] [step_ms=50] */
#include "common.h"

#define PAGE 4096

__attribute__((noinline)) char *grow_working_set(size_t bytes)
{
	char *p = malloc(bytes);
	if (p)
		memset(p, 0x5a, bytes);
	return p;
}

__attribute__((noinline)) long walk_working_set(char **chunks, long n, size_t chunk)
{
	long sum = 0;
	for (long c = 0; c < n; c++)
		for (size_t off = 0; off < chunk; off += PAGE) {
			sum += chunks[c][off];
			chunks[c][off]++;
		}
	return sum;
}

int main(int argc, char **argv)
{
	long total = arg_long(argc, argv, 1, 256);
	long step = arg_long(argc, argv, 2, 8);
	long step_ms = arg_long(argc, argv, 3, 50);
	long n = total / step, have = 0;
	char **chunks = calloc(n, sizeof(*chunks));
	volatile long sink = 0;

	ready();
	while (have < n) {
		chunks[have] = grow_working_set((size_t)step << 20);
		if (!chunks[have])
			break;
		have++;
		sleep_ms(step_ms);
	}
	for (;;) {
		sink += walk_working_set(chunks, have, (size_t)step << 20);
		sleep_ms(step_ms);
	}
}
