/* Three threads. The leaker runs an error-branch leak: leaky_step() mallocs a 1 KiB block and
 * drops it (never freed) for 1 id in 5. Two holders run hold_in_registers(): malloc a 4 KiB
 * block, keep the ONLY pointer to it in a local (a register, or this thread's stack once a call
 * spills it) while spinning and then sleeping, use it, free it, repeat. A scan that stops the
 * process must see the holders' blocks as anchored (registers, thread stacks), not leaked.
 * usage: threads [leaks_per_second=500] */
#include "common.h"
#include <pthread.h>

static volatile long sink; /* sums land here, so the compiler keeps every memset */

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

__attribute__((noinline)) long leaky_step(long id)
{
	unsigned char *b = malloc(1024);
	if (!b)
		return 0;
	memset(b, (int)(id % 251) + 1, 1024); /* resident */
	long v = ((volatile unsigned char *)b)[id % 1024]; /* a real read: the memset stays */
	if (id % 5 == 0)
		return v; /* the error branch: b is dropped here, never freed */
	free(b);
	return v;
}

__attribute__((noinline)) long hold_in_registers(long spin_ms, long nap_ms)
{
	volatile unsigned char *b = malloc(4096);
	if (!b)
		return 0;
	memset((void *)b, 0x5a, 4096);
	long sum = 0, end = now_ms() + spin_ms;
	for (long i = 0; now_ms() < end; i++) /* busy: b is live in a register */
		sum += b[i & 4095];
	sleep_ms(nap_ms); /* asleep: b is in a callee-saved register or spilled on this stack */
	sum += b[4095]; /* used after the sleep, so it stays live across it */
	free((void *)b);
	return sum;
}

static void *leaker(void *arg)
{
	long per_tick = *(long *)arg;
	for (long id = 0;;) {
		for (long i = 0; i < per_tick; i++)
			sink += leaky_step(id++);
		sleep_ms(100);
	}
	return NULL;
}

static void *holder(void *arg)
{
	const long *ms = arg; /* spin_ms, nap_ms */
	for (;;)
		sink += hold_in_registers(ms[0], ms[1]);
	return NULL;
}

int main(int argc, char **argv)
{
	static long per_tick;
	static const long holder2[2] = { 20, 30 }, holder3[2] = { 5, 45 };
	pthread_t t1, t2, t3;

	per_tick = arg_long(argc, argv, 1, 500) / 10; /* 10 ticks a second */
	if (per_tick < 1)
		per_tick = 1;
	if (pthread_create(&t1, NULL, leaker, &per_tick) || pthread_create(&t2, NULL, holder, (void *)holder2) ||
	    pthread_create(&t3, NULL, holder, (void *)holder3)) {
		perror("pthread_create");
		return 1;
	}
	ready();
	for (;;)
		pause();
}
