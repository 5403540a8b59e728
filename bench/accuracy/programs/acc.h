/* What the corpus's C and C++ programs share: arguments, the ready line the scorer waits for,
 * and a sleep. Written for the accuracy corpus (bench/accuracy), not shared with tests/workloads. */
#ifndef ACC_H
#define ACC_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline long arg(int argc, char **argv, int i, long dflt)
{
	return argc > i ? strtol(argv[i], NULL, 10) : dflt;
}

static inline void say_ready(void)
{
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
}

static inline void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}
#endif
