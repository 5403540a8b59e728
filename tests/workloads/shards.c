/* A supervisor and its shards, all in one cgroup: the supervisor forks SHARDS processes and waits;
 * each applies RATE updates a second to a record it mallocs and frees, except that the last shard
 * merges every Nth update into a record it mallocs afresh, dropping the old one unfreed (nothing
 * global points at it). The others churn and keep nothing. Diagnosed through the cgroup (the
 * supervisor is no grower, and the shards start the same size): only one process grows.
 * usage: shards [shards=3] [rate=2000] [N=3] */
#include <signal.h>
#include <sys/prctl.h>
#include "common.h"

static volatile long sink;

__attribute__((noinline)) static long apply_update(int shard, int leaky, long n, long every)
{
	char *rec = malloc(768 + n % 256);
	if (!rec)
		return 0;
	memset(rec, 'a' + shard, 768);
	if (leaky && n % every == 0) { /* the merge path: a new record, the old one dropped */
		rec = malloc(768);
		if (!rec)
			return 0;
		memset(rec, 'm', 768);
	}
	long v = ((volatile char *)rec)[n % 768];
	free(rec);
	return v;
}

int main(int argc, char **argv)
{
	long shards = arg_long(argc, argv, 1, 3), rate = arg_long(argc, argv, 2, 2000);
	long every = arg_long(argc, argv, 3, 3);
	for (int s = 0; s < shards; s++) {
		if (fork() != 0)
			continue;
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* no shard outlives the supervisor */
		prctl(PR_SET_NAME, s == shards - 1 ? "shard-merge" : "shard"); /* the test tells them apart */
		for (long n = 1;;) {
			for (long i = 0; i < rate / 50; i++, n++)
				sink += apply_update(s, s == shards - 1, n, every) + handle_request(n);
			sleep_ms(20);
		}
	}
	ready();
	for (;;)
		pause();
}
