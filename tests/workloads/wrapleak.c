/* Leaks behind allocation wrappers: the culprit is the wrapper's caller. process_order() gets its
 * order from xmalloc() (a listed wrapper name) and drops 1 in N on an error branch; take_ticket()
 * gets its ticket from ticket_alloc(), a wrapper nobody lists (it only checks and counts what
 * malloc returned), and keeps 1 in N in no structure at all (a second leak, smaller); both free
 * the rest. handle_request() churns scratch buffers.
 * usage: wrapleak [orders_per_second=2000] [N=7] */
#include "common.h"

struct order { long id; long checksum; unsigned char payload[1008]; };
struct ticket { long id; char note[120]; };

static volatile long sink;
static long ticket_bytes; /* what ticket_alloc handed out: it counts, it does not touch the block */

__attribute__((noinline)) void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p) {
		perror("xmalloc");
		exit(1);
	}
	return p;
}

__attribute__((noinline)) void *ticket_alloc(size_t n)
{
	void *p = malloc(n);
	if (!p)
		abort();
	ticket_bytes += (long)n;
	return p;
}

__attribute__((noinline)) long process_order(long id, long n)
{
	struct order *o = xmalloc(sizeof(*o));
	o->id = id;
	memset(o->payload, (int)(id % 251) + 1, sizeof(o->payload)); /* resident */
	o->checksum = o->payload[id % 1008];
	if (id % n == 0)
		return -1; /* the error branch: o is dropped here, never freed */
	long sum = o->checksum;
	free(o);
	return sum;
}

__attribute__((noinline)) long take_ticket(long id, long n)
{
	struct ticket *t = ticket_alloc(sizeof(*t));
	t->id = id;
	memset(t->note, (int)(id % 7) + 1, sizeof(t->note));
	if (id % (3 * n) == 1)
		return -1; /* dropped, less often than orders */
	long v = t->note[id % 120];
	free(t);
	return v;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 2000);
	long n = arg_long(argc, argv, 2, 7);
	long per_tick = rate / 10 > 0 ? rate / 10 : 1;

	if (n < 1)
		n = 1;
	ready();
	for (long id = 1;;) {
		for (long i = 0; i < per_tick; i++, id++) {
			sink += process_order(id, n);
			sink += take_ticket(id, n);
			sink += handle_request(id);
		}
		sink += ticket_bytes;
		sleep_ms(100);
	}
}
