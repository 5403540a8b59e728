/* A big target for the scan: allocates MiB of memory at start in 64 KiB blocks held in the
 * global arena[] and touches every block (so RSS reaches MiB), then runs a slow error-branch
 * leak forever: leak_slowly() drops 1 in 4 of its 4 KiB blocks, handle_request() churns freed
 * scratch buffers.
 * usage: bigheap [MiB=1024] */
#include "common.h"

#define BLOCK (64 * 1024)
#define MAX_BLOCKS (1 << 18) /* 16 GiB at most */

static char *arena[MAX_BLOCKS];
static volatile long sink; /* sums land here, so the compiler keeps every memset */

__attribute__((noinline)) long fill_arena(long mib)
{
	long blocks = mib * (1024 * 1024 / BLOCK), n = 0;
	for (; n < blocks && n < MAX_BLOCKS; n++) {
		if (!(arena[n] = malloc(BLOCK)))
			break;
		memset(arena[n], (int)(n % 251) + 1, BLOCK); /* resident */
	}
	return n;
}

__attribute__((noinline)) long leak_slowly(long id)
{
	unsigned char *b = malloc(4096);
	if (!b)
		return 0;
	memset(b, (int)(id % 251) + 1, 4096); /* resident */
	long v = ((volatile unsigned char *)b)[id % 4096]; /* a real read: the memset stays */
	if (id % 4 == 0)
		return v; /* the error branch: b is dropped here, never freed */
	free(b);
	return v;
}

int main(int argc, char **argv)
{
	long blocks = fill_arena(arg_long(argc, argv, 1, 1024));

	ready();
	for (long id = 0;;) {
		for (long i = 0; i < 20; i++, id++) { /* 200 a second */
			sink += leak_slowly(id);
			sink += handle_request(id);
			if (blocks > 0) /* the arena stays in use */
				sink += arena[id % blocks][id % BLOCK];
		}
		sleep_ms(100);
	}
}
