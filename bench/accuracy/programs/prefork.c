/* A pre-fork upload server: the parent forks WORKERS workers and waits; each handles RATE uploads a
 * second, a buffer per upload freed when done, but worker 0's retry path (1 upload in RETRY_EVERY
 * is retried) allocates a second buffer and drops the first unfreed. Diagnosed through the cgroup
 * that holds them all. prefork WORKERS RATE RETRY_EVERY */
#include <signal.h>
#include <sys/prctl.h>
#include "acc.h"

__attribute__((noinline)) static long handle_upload(int worker, long n, long retry_every)
{
	char *buf = malloc(1024 + n % 512);
	if (!buf)
		return 0;
	memset(buf, 'u', 1024);
	if (worker == 0 && retry_every && n % retry_every == 0) {
		buf = malloc(1024); /* the retry's buffer: the first one is lost */
		if (!buf)
			return 0;
		memset(buf, 'r', 1024);
	}
	long v = buf[n % 1024];
	free(buf);
	return v;
}

static void work(int worker, long rate, long retry_every)
{
	volatile long sink = 0;
	for (long n = 1;; ) {
		for (long i = 0; i < rate / 100; i++)
			sink += handle_upload(worker, n++, retry_every);
		nap_ms(10);
	}
}

int main(int argc, char **argv)
{
	long workers = arg(argc, argv, 1, 3), rate = arg(argc, argv, 2, 1000), retry_every = arg(argc, argv, 3, 4);
	for (int w = 0; w < workers; w++)
		if (fork() == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL); /* no worker outlives its parent */
			work(w, rate, retry_every);
		}
	say_ready();
	for (;;)
		pause();
}
