/* A job runner: each job gets a pipe to report its result through. fdjobs RATE FORGET_EVERY: RATE
 * jobs/s; every FORGET_EVERY-th job times out and the timeout path closes the write end only, so
 * the read end stays open for ever (0: every path closes both). */
#include <fcntl.h>
#include "acc.h"

__attribute__((noinline)) static int start_job(long id, long forget_every)
{
	int p[2];
	if (pipe(p) != 0)
		return -1;
	char byte = (char)id;
	if (write(p[1], &byte, 1) != 1)
		return -1;
	if (forget_every && id % forget_every == 0) {
		close(p[1]); /* timed out: the read end is forgotten */
		return 0;
	}
	if (read(p[0], &byte, 1) != 1)
		return -1;
	close(p[0]);
	close(p[1]);
	return byte;
}

int main(int argc, char **argv)
{
	long rate = arg(argc, argv, 1, 20), forget_every = arg(argc, argv, 2, 4);
	say_ready();
	for (long id = 1;; id++) {
		start_job(id, forget_every);
		nap_ms(1000 / rate);
	}
}
