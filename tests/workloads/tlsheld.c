/* Growth held in thread-local storage: keep_in_tls() pushes every node it allocates onto a list
 * whose head is a __thread variable of the main thread, and never frees one. Nothing is leaked;
 * the anchor is the thread-local variable `mine`.
 * usage: tlsheld [nodes_per_second=1000] */
#include "common.h"

struct node {
	struct node *next;
	char payload[1000];
};

static __thread struct node *mine;

__attribute__((noinline)) void keep_in_tls(long id)
{
	struct node *n = malloc(sizeof(*n));
	if (!n)
		return;
	memset(n->payload, (int)id, sizeof(n->payload));
	n->next = mine;
	mine = n;
}

int main(int argc, char **argv)
{
	long per_tick = arg_long(argc, argv, 1, 1000) / 10;
	long id = 0;

	if (per_tick < 1)
		per_tick = 1;
	ready();
	for (;;) {
		for (long i = 0; i < per_tick; i++)
			keep_in_tls(id++);
		sleep_ms(100);
	}
}
