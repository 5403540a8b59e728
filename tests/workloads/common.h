/* Shared bits of the workload kit: argument parsing and a ready line on stdout so the
 * harness knows the workload is running before it starts measuring. */
#ifndef WORKLOAD_COMMON_H
#define WORKLOAD_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline long arg_long(int argc, char **argv, int i, long dflt)
{
	return argc > i ? strtol(argv[i], NULL, 10) : dflt;
}

static inline void ready(void)
{
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
}

static inline void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Churn that is never outstanding: a request buffer allocated, used (a real read, so the
 * compiler keeps the memset) and freed. Named, so stacks show it apart from the leak. */
__attribute__((noinline, unused)) static long handle_request(long id)
{
	unsigned char *tmp = malloc(256 + id % 512);
	if (!tmp)
		return 0;
	memset(tmp, 1, 256);
	long v = ((volatile unsigned char *)tmp)[id % 256];
	free(tmp);
	return v;
}
#endif
