/* A business day compressed: phases of phase_s seconds alternate, "day" first. By day the service
 * answers queries through a cache (cache_insert(): an LRU ring of 4 KiB entries that fills to
 * cache_MiB over the first day, then evicts the oldest for every new one: it levels off); by night
 * it runs a batch job (night_batch()) whose error branch drops 1 record in 7 (a leak that grows
 * only at night). leak_per_s 0: no batch job, the cache alone.
 * usage: dayshift [phase_s=15] [cache_MiB=16] [leak_per_s=2000] */
#include "common.h"

#define ENTRY 4096
#define RECORD 1024

static char **ring;
static long slots, head, used;
static volatile long sink;

__attribute__((noinline)) void cache_insert(long key)
{
	if (used == slots) { /* full: evict the oldest */
		free(ring[head]);
		used--;
	}
	char *e = malloc(ENTRY);
	if (!e)
		return;
	memset(e, (int)key, ENTRY);
	ring[head] = e;
	head = (head + 1) % slots;
	used++;
}

__attribute__((noinline)) long night_batch(long id)
{
	char *r = malloc(RECORD);
	if (!r)
		return 0;
	memset(r, (int)(id % 251) + 1, RECORD);
	long v = ((volatile char *)r)[id % RECORD];
	if (id % 7 == 0)
		return v; /* the error branch: the record is dropped, never freed */
	free(r);
	return v;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	long phase_s = arg_long(argc, argv, 1, 15);
	long cache = arg_long(argc, argv, 2, 16) * 1024 * 1024;
	long leak_per_s = arg_long(argc, argv, 3, 2000);
	slots = cache / ENTRY;
	ring = calloc(slots, sizeof(*ring));
	/* the first day fills the cache: slots over phase_s seconds, 10 ticks a second */
	long inserts = slots / (phase_s * 10 > 0 ? phase_s * 10 : 1) + 1;
	long batch = leak_per_s / 10;
	long key = 0, id = 1;
	double start = now_s();

	ready();
	for (;;) {
		int night = ((long)((now_s() - start) / phase_s)) % 2;
		if (!night)
			for (long i = 0; i < inserts; i++)
				cache_insert(key++);
		else
			for (long i = 0; i < batch; i++)
				sink += night_batch(id++);
		sleep_ms(100);
	}
}
