/* A heap glibc's malloc holds mostly free: COUNT blocks of BLOCK bytes (64 KiB by default: under
 * the mmap threshold, all in the brk heap) written, then three of every four freed; the kept ones
 * stop the freed from merging into the top, so the allocator keeps them on its bins (each run of
 * three merged into one free chunk). Prints "freed BYTES KEPT_BYTES" (bytes asked) and sleeps.
 * TOUCH: the bytes of each block written (all of it by default): the rest of its pages are never
 * resident, freed or not. usage: fragment [COUNT] [BLOCK] [TOUCH] */
#include "common.h"

int main(int argc, char **argv)
{
	long count = arg_long(argc, argv, 1, 1600); /* 100 MiB by default */
	long BLOCK = arg_long(argc, argv, 2, 64 << 10);
	long touch = arg_long(argc, argv, 3, BLOCK);
	void **blocks = calloc(count, sizeof(void *));
	long freed = 0, kept = 0;

	if (!blocks)
		return 1;
	for (long i = 0; i < count; i++) {
		blocks[i] = malloc(BLOCK);
		if (!blocks[i])
			return 1;
		memset(blocks[i], 1, touch < BLOCK ? touch : BLOCK);
	}
	for (long i = 0; i < count; i++) {
		if (i % 4 == 3) {
			kept += BLOCK;
			continue;
		}
		free(blocks[i]);
		freed += BLOCK;
	}
	ready();
	printf("freed %ld %ld\n", freed, kept);
	fflush(stdout);
	for (;;)
		sleep(60);
}
