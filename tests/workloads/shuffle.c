/* A target that mutates its pointers while scanned: two global singly linked lists, list_a and
 * list_b. Every 5 ms add_node() pushes a new 256 B node onto list_a (200 a second) and, past
 * bound nodes, free_oldest() frees the oldest. In between, move_nodes() spins without sleeping,
 * popping nodes off one list's head and pushing them onto the other and back, so at any instant
 * a node in transit may be referenced only from a register or a local.
 * usage: shuffle [bound=4096] */
#include "common.h"

struct node {
	struct node *next;
	long seq;
	unsigned char payload[256 - 3 * sizeof(long)];
	long moves; /* on the node's last cache line: bumping it makes the transit last */
};

/* volatile: every push and pop really rewrites the globals, in program order */
static struct node *volatile list_a, *volatile list_b;
static long count;

__attribute__((noinline)) void add_node(long seq)
{
	struct node *n = malloc(sizeof(*n));
	if (!n)
		return;
	n->seq = seq;
	n->moves = 0;
	memset(n->payload, (int)(seq % 251) + 1, sizeof(n->payload)); /* resident */
	n->next = list_a;
	list_a = n;
	count++;
}

__attribute__((noinline)) void free_oldest(void)
{
	struct node *volatile *lists[2] = { &list_a, &list_b }, *volatile *victim = NULL;
	for (int l = 0; l < 2; l++) /* the oldest (lowest seq) node may sit in either list */
		for (struct node *volatile *p = lists[l]; *p; p = &(*p)->next)
			if (!victim || (*p)->seq < (*victim)->seq)
				victim = p;
	if (!victim)
		return;
	struct node *n = *victim;
	*victim = n->next; /* unlink, then free */
	free(n);
	count--;
}

static inline long move_one(struct node *volatile *from, struct node *volatile *to)
{
	struct node *n = *from;
	if (!n)
		return 0;
	*from = n->next; /* n is in transit: only this register points at it */
	n->moves++;
	n->next = *to;
	*to = n;
	return 1;
}

__attribute__((noinline)) void move_nodes(long k, int flip)
{
	struct node *volatile *src = flip ? &list_b : &list_a, *volatile *dst = flip ? &list_a : &list_b;
	for (long i = 0; i < k && move_one(src, dst); i++) /* k one way ... */
		;
	for (long i = 0; i < k - 1 && move_one(dst, src); i++) /* ... and k - 1 back */
		;
}

static long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long bound = arg_long(argc, argv, 1, 4096);
	long start = now_ns(), seq = 0;

	ready();
	for (long round = 0;; round++) {
		move_nodes(32 + round % 33, round & 1);
		while (seq < (now_ns() - start) / 5000000L + 1) { /* the producer: one node per 5 ms */
			add_node(seq++);
			if (count > bound)
				free_oldest();
		}
	}
}
