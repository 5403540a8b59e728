/* Benchmark target: malloc/free of mixed sizes at a set rate, with a slow leak from one named
 * function, reporting its own cost per operation so start-up and sleeping are excluded: every
 * second it prints "ns_per_op N ops M cpu_ns_per_op C": the time spent inside its allocation batches
 * per operation (wall clock: what its throughput sees, preemption included), how many operations
 * they did, and its thread's CPU time per operation (traps are charged to it; time other processes
 * took from it on a busy machine is not), so the time it lost to tracing can be summed:
 * (N - untraced N) x M, or by its CPU clock (C - untraced C) x M.
 * usage: bench_alloc [allocs_per_second=100000 (0: as fast as it can)] [leak_KiB_per_second=256] */
#include "common.h"

static inline long clock_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline long now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

__attribute__((noinline)) void *leak_bench_records(size_t bytes)
{
	char *p = malloc(bytes);
	if (p)
		memset(p, 3, bytes);
	return p;
}

__attribute__((noinline)) unsigned long alloc_batch(long n, unsigned long seed)
{
	unsigned long sum = 0;
	for (long i = 0; i < n; i++) {
		size_t sz = 16 + ((seed + (unsigned long)i) * 2654435761u) % 1024;
		char *p = malloc(sz);
		if (p) {
			p[0] = (char)i;
			sum += (unsigned char)p[0];
			free(p);
		}
	}
	return sum;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 100000);
	long leak_kib = arg_long(argc, argv, 2, 256);
	const long tick_ns = 10000000L; /* 100 ticks a second */
	long batch = rate > 0 ? rate / 100 : 20000;
	volatile unsigned long sink = 0;
	long busy = 0, cpu = 0, ops = 0, report_at = now_ns() + 1000000000L, ticks = 0;

	if (batch < 1)
		batch = 1;
	ready();
	for (unsigned long seed = 0;; seed++) {
		long t0 = now_ns(), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
		sink += alloc_batch(batch, seed);
		long t1 = now_ns();
		cpu += clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
		busy += t1 - t0;
		ops += batch;
		if (++ticks % 10 == 0) /* ten times a second */
			leak_bench_records((size_t)leak_kib * 1024 / 10);
		if (t1 >= report_at) {
			printf("ns_per_op %.2f ops %ld cpu_ns_per_op %.2f\n", (double)busy / (double)ops, ops,
			       (double)cpu / (double)ops);
			fflush(stdout);
			busy = cpu = ops = 0;
			report_at = t1 + 1000000000L;
		}
		if (rate > 0) {
			long left = tick_ns - (now_ns() - t0);
			if (left > 0)
				sleep_ms(left / 1000000L);
		}
	}
}
