/* A steady leak from one named function: leak_order_history() keeps every record it
 * allocates, while handle_request() churns short-lived buffers that are freed.
 * usage: leak [KiB_per_second=2048] [cap_MiB=1024] [start_after_s=0: only churn before] */
#include "common.h"

struct order { long id; char payload[]; };

__attribute__((noinline)) void *leak_order_history(long id, size_t size)
{
	struct order *o = malloc(sizeof(*o) + size);
	if (!o)
		return NULL;
	o->id = id;
	memset(o->payload, (int)id, size); /* touch it: the leak is resident, not just reserved */
	return o; /* the caller drops it: never freed */
}

int main(int argc, char **argv)
{
	long kib_per_s = arg_long(argc, argv, 1, 2048);
	long cap = arg_long(argc, argv, 2, 1024) * 1024 * 1024;
	const size_t rec = 4096; /* one page per leaked record */
	long per_tick = kib_per_s * 1024 / 10 / (long)rec; /* 10 ticks a second */
	long leaked = 0, id = 0;
	long quiet_ticks = arg_long(argc, argv, 3, 0) * 10;

	if (per_tick < 1)
		per_tick = 1;
	ready();
	for (;;) {
		if (quiet_ticks > 0) {
			quiet_ticks--;
			for (int j = 0; j < 4; j++)
				handle_request(id + j);
			sleep_ms(100);
			continue;
		}
		for (long i = 0; i < per_tick && leaked < cap; i++, id++) {
			if (leak_order_history(id, rec - sizeof(struct order)))
				leaked += rec;
			for (int j = 0; j < 4; j++)
				handle_request(id + j);
		}
		sleep_ms(100);
	}
}
