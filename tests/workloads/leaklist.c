/* A leaked linked structure: build_batch() builds a singly linked list of 16 nodes, each
 * malloc'd by new_node() with node->next pointing at the next one, walks it summing, then drops
 * the head pointer without freeing anything. Every node but the head is pointed at, but only
 * from other leaked nodes: nothing reachable points at the head.
 * usage: leaklist [batches_per_second=50] */
#include "common.h"

#define NODES 16
#define NODE_BYTES 512

struct node {
	struct node *next;
	long seq;
	unsigned char payload[NODE_BYTES - 2 * sizeof(long)];
};

static volatile long sink; /* sums land here, so the walk is not optimized away */

__attribute__((noinline)) struct node *new_node(struct node *next, long seq)
{
	struct node *n = malloc(sizeof(*n));
	if (!n)
		return next;
	n->next = next;
	n->seq = seq;
	memset(n->payload, (int)(seq % 251) + 1, sizeof(n->payload)); /* resident */
	return n;
}

__attribute__((noinline)) long build_batch(long batch)
{
	struct node *head = NULL;
	for (long i = 0; i < NODES; i++) /* prepend: head is the newest node */
		head = new_node(head, batch * NODES + i);
	long sum = 0;
	for (struct node *n = head; n; n = n->next)
		sum += n->seq + n->payload[n->seq % sizeof(n->payload)];
	return sum; /* head goes out of scope here: the whole list is leaked */
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 50);
	long per_tick = rate / 10 > 0 ? rate / 10 : 1; /* 10 ticks a second */

	ready();
	for (long batch = 0;;) {
		for (long i = 0; i < per_tick; i++, batch++) {
			sink += build_batch(batch);
			for (int j = 0; j < 4; j++)
				sink += handle_request(batch + j);
		}
		sleep_ms(100);
	}
}
