/* A registry that only grows: register_entry() mallocs an entry, fills it and appends it to the
 * global array registry[] in .bss; nothing is ever removed or freed, so every entry stays
 * reachable (anchored) from a global. Appending stops at the array's end; lookup_entry() reads
 * entries back and handle_request() churns freed scratch buffers, so allocation goes on.
 * usage: registry [entries_per_second=1000] */
#include "common.h"

#define ENTRY_BYTES 2048

struct entry {
	long id;
	long hits;
	char name[ENTRY_BYTES - 2 * sizeof(long)];
};

static struct entry *registry[1 << 20];
static long registry_len;
static volatile long sink; /* sums land here, so reads are not optimized away */

__attribute__((noinline)) void register_entry(long id)
{
	if (registry_len >= (long)(sizeof(registry) / sizeof(registry[0])))
		return; /* full: stop appending */
	struct entry *e = malloc(sizeof(*e));
	if (!e)
		return;
	e->id = id;
	e->hits = 0;
	memset(e->name, (int)(id % 251) + 1, sizeof(e->name)); /* resident */
	registry[registry_len++] = e;
}

__attribute__((noinline)) long lookup_entry(long id)
{
	if (registry_len == 0)
		return 0;
	struct entry *e = registry[id % registry_len];
	e->hits++;
	return e->id + e->name[id % sizeof(e->name)];
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 1000);
	long per_tick = rate / 10 > 0 ? rate / 10 : 1; /* 10 ticks a second */

	ready();
	for (long id = 0;;) {
		for (long i = 0; i < per_tick; i++, id++) {
			register_entry(id);
			sink += lookup_entry(id * 7919);
			sink += handle_request(id);
		}
		sleep_ms(100);
	}
}
