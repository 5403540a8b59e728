/* A cache that fills to a bound and then levels off: cache_insert() adds entries until the
 * cache holds bound_MiB, then evicts the oldest for every new one (LRU ring), so memory
 * churns at the bound instead of growing.
 * usage: cache [bound_MiB=64] [fill_seconds=6] */
#include "common.h"

#define ENTRY 4096

static char **ring;
static long slots, head, used;

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

int main(int argc, char **argv)
{
	long bound = arg_long(argc, argv, 1, 64) * 1024 * 1024;
	long fill_s = arg_long(argc, argv, 2, 6);
	slots = bound / ENTRY;
	ring = calloc(slots, sizeof(*ring));
	long per_tick = slots / (fill_s * 10 > 0 ? fill_s * 10 : 1); /* fill in fill_s seconds */
	long key = 0;

	if (per_tick < 1)
		per_tick = 1;
	ready();
	for (;;) {
		for (long i = 0; i < per_tick; i++)
			cache_insert(key++);
		sleep_ms(100);
	}
}
