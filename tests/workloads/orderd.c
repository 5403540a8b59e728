/* The demo service: orders taken at a steady rate, 1 in N dropped on an error branch and
 * never freed. process_order() is static and its `origin` argument unused: GCC at -O2 drops the
 * argument and names the copy it calls `process_order.isra.0` (a clone), which memdiag reads
 * as process_order. The leak is at the line marked LEAK below.
 * usage: orderd [orders_per_second=1000] [N=5] */
#include "common.h"

struct order { long id; long total; unsigned char lines[1000]; };

static volatile long sink;

__attribute__((noinline)) static long process_order(const char *origin, long id, long n)
{
	struct order *o = malloc(sizeof(*o)); /* LEAK */
	if (!o)
		abort();
	o->id = id;
	memset(o->lines, (int)(id % 251) + 1, sizeof(o->lines));
	o->total = o->lines[id % 1000];
	if (id % n == 0)
		return -1; /* dropped: o is never freed */
	long total = o->total;
	free(o);
	return total;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 1000);
	long n = arg_long(argc, argv, 2, 5);
	long per_tick = rate / 10 > 0 ? rate / 10 : 1;

	if (n < 1)
		n = 1;
	ready();
	for (long id = 1;;) {
		for (long i = 0; i < per_tick; i++, id++) {
			sink += process_order(argv[0], id, n);
			sink += handle_request(id);
		}
		sleep_ms(100);
	}
}
