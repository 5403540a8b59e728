/* A periodic batch job: every PERIOD s it reads a batch into MIB MiB of 256 KiB buffers over a few
 * seconds, works on it, then frees all of it. batcher PERIOD MIB */
#include "acc.h"

#define CHUNK (256 << 10)

__attribute__((noinline)) static long run_batch(long mib)
{
	long n = mib * 4, sum = 0;
	char **bufs = calloc(n, sizeof *bufs);
	for (long i = 0; i < n; i++) {
		bufs[i] = malloc(CHUNK);
		memset(bufs[i], (int)i, CHUNK);
		if (i % 16 == 15)
			nap_ms(100);
	}
	for (long i = 0; i < n; i++) {
		sum += bufs[i][i % CHUNK];
		free(bufs[i]);
	}
	free(bufs);
	return sum;
}

int main(int argc, char **argv)
{
	long period = arg(argc, argv, 1, 8), mib = arg(argc, argv, 2, 48);
	volatile long sink = 0;
	say_ready();
	for (;;) {
		time_t start = time(NULL);
		sink += run_batch(mib);
		while (time(NULL) - start < period)
			nap_ms(100);
	}
	return (int)sink;
}
