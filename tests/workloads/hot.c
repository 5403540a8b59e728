/* A hot allocator with a slow leak: hot_path() mallocs and frees small blocks as fast as it can
 * (millions of calls a second), while leak_session_cache() keeps 1 MiB a second, touched.
 * usage: hot [leak_KiB_per_second=1024] */
#include "common.h"

__attribute__((noinline)) void *leak_session_cache(size_t bytes)
{
	char *p = malloc(bytes);
	if (p)
		memset(p, 7, bytes);
	return p;
}

__attribute__((noinline)) unsigned long hot_path(unsigned long i)
{
	char *p = malloc(16 + (i & 255));
	if (!p)
		return 0;
	p[0] = (char)i;
	unsigned long v = (unsigned char)p[0];
	free(p);
	return v;
}

int main(int argc, char **argv)
{
	long kib = arg_long(argc, argv, 1, 1024);
	volatile unsigned long sink = 0;
	struct timespec last, now;

	clock_gettime(CLOCK_MONOTONIC, &last);
	ready();
	for (unsigned long i = 0;; i++) {
		sink += hot_path(i);
		if ((i & 4095) == 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			if ((now.tv_sec - last.tv_sec) * 1000000000L + (now.tv_nsec - last.tv_nsec) >= 100000000L) {
				leak_session_cache((size_t)kib * 1024 / 10); /* ten times a second */
				last = now;
			}
		}
	}
}
