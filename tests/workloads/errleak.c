/* The error-branch leak: process_order() mallocs an order, fills it and hands it to
 * validate_order(); one order in N fails validation and process_order() returns early without
 * freeing it, dropping the only pointer (nothing global, nothing printed). The other orders are
 * freed, and handle_request() churns scratch buffers that are freed too.
 * Built with -DFIXED the error branch frees the order (the fix, for memdiag verify); with -DFIXED
 * -DAUDIT_LEAK too, the fix comes with another leak: audit_failure() keeps a record of each failed
 * order that nothing points at.
 * usage: errleak [orders_per_second=2000] [N=7] [order_bytes=1024] */
#include "common.h"

struct order { long id; long checksum; unsigned char payload[]; };

static volatile long sink; /* sums land here, so the compiler keeps every memset */

__attribute__((noinline)) int validate_order(struct order *o, size_t size, long n)
{
	long sum = 0;
	for (size_t i = 0; i < size; i += 64) /* reads the payload: its memset cannot be dropped */
		sum += o->payload[i];
	o->checksum = sum;
	return o->id % n != 0; /* 1 in n orders fails */
}

#ifdef AUDIT_LEAK
__attribute__((noinline)) void audit_failure(long id, size_t size)
{
	long *record = malloc(size); /* kept nowhere: the new leak */
	if (record) {
		memset(record, 0x3c, size);
		record[0] = id;
		sink += ((volatile long *)record)[0]; /* read back: the compiler keeps the allocation */
	}
}
#endif

__attribute__((noinline)) long process_order(long id, size_t size, long n)
{
	struct order *o = malloc(sizeof(*o) + size);
	if (!o)
		return 0;
	o->id = id;
	memset(o->payload, (int)(id % 251) + 1, size); /* touch it: the leak is resident */
	if (!validate_order(o, size, n)) {
#ifdef FIXED
		free(o);
#ifdef AUDIT_LEAK
		audit_failure(id, size);
#endif
#endif
		return -1; /* the error branch: o is dropped here, never freed (unless FIXED) */
	}
	long sum = o->checksum;
	free(o);
	return sum;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 2000);
	long n = arg_long(argc, argv, 2, 7);
	long bytes = arg_long(argc, argv, 3, 1024);
	size_t size = bytes > (long)sizeof(struct order) ? bytes - sizeof(struct order) : 64;
	long per_tick = rate / 10 > 0 ? rate / 10 : 1; /* 10 ticks a second */

	if (n < 1)
		n = 1;
	ready();
	for (long id = 1;;) {
		for (long i = 0; i < per_tick; i++, id++) {
			sink += process_order(id, size, n);
			sink += handle_request(id);
		}
		sleep_ms(100);
	}
}
