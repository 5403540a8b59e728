/* A job that comes in waves: every PERIOD s it maps MIB MiB of 1 MiB work areas over about 1.5 s,
 * touches them, holds them half a second and unmaps them all; with KEEP=k it forgets to unmap 1 area
 * in k each wave (a step that stays behind: the troughs between waves rise). mmap, not malloc, so
 * what it gives back leaves its RSS at once whatever the allocator's trimming.
 * usage: waves [period_s=5] [mib=32] [keep=0] */
#include <sys/mman.h>
#include "common.h"

#define AREA (1L << 20)

static volatile long sink;

__attribute__((noinline)) static void run_wave(long mib, long keep)
{
	char *areas[1024];
	long n = mib < 1024 ? mib : 1024;
	for (long i = 0; i < n; i++) {
		areas[i] = mmap(NULL, AREA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (areas[i] == MAP_FAILED)
			areas[i] = NULL;
		else
			memset(areas[i], (int)i + 1, AREA);
		sleep_ms(1500 / n);
	}
	sleep_ms(500);
	for (long i = 0; i < n; i++) {
		if (!areas[i])
			continue;
		sink += areas[i][i];
		if (keep && i % keep == 0)
			continue; /* the forgotten one: still mapped, no pointer kept */
		munmap(areas[i], AREA);
	}
}

int main(int argc, char **argv)
{
	long period = arg_long(argc, argv, 1, 5), mib = arg_long(argc, argv, 2, 32), keep = arg_long(argc, argv, 3, 0);
	ready();
	for (;;) {
		run_wave(mib, keep);
		sleep_ms(period * 1000 - 2000);
	}
}
