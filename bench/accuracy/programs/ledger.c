/* A payment ledger: every payment gets a record; the last 64 are kept in a ring (the older ones
 * freed), but a payment rejected as a duplicate returns early and drops its record unfreed.
 * ledger RATE DUP_EVERY: RATE payments/s, every DUP_EVERY-th a duplicate (the leak). */
#include "acc.h"

struct payment {
	long id;
	char memo[1000];
};

static struct payment *recent[64];

__attribute__((noinline)) static void post_payment(long id, long dup_every)
{
	struct payment *p = malloc(sizeof *p + (id % 5) * 48);
	if (!p)
		return;
	p->id = id;
	memset(p->memo, 'm', sizeof p->memo);
	if (dup_every && id % dup_every == 0)
		return; /* the duplicate path: the record is dropped, never freed */
	free(recent[id % 64]);
	recent[id % 64] = p;
}

int main(int argc, char **argv)
{
	long rate = arg(argc, argv, 1, 1000), dup_every = arg(argc, argv, 2, 4);
	say_ready();
	for (long id = 1;; ) {
		for (long i = 0; i < rate / 100; i++)
			post_payment(id++, dup_every);
		nap_ms(10);
	}
}
