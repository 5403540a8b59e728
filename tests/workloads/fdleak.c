/* Leaks descriptors, not memory: each "session" opens a socket pair for a handshake; one in
 * every `fail_every` handshakes fails and handshake_fails() returns without closing its pair,
 * while serve_session() closes the pairs of the others. Every session also makes and closes a
 * pipe and an eventfd (churn that is never outstanding).
 * usage: fdleak [sessions_per_second=50] [fail_every=5] */
#include "common.h"
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* the error path: the pair stays open (the leak the probe must name) */
__attribute__((noinline)) int handshake_fails(long id)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return -1;
	if (write(sv[0], &id, sizeof(id)) < 0)
		return -1;
	return -1; /* forgot close(sv[0]) and close(sv[1]) */
}

/* the good path: the same pair, closed */
__attribute__((noinline)) int serve_session(long id)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return -1;
	long got = 0;
	if (write(sv[0], &id, sizeof(id)) < 0 || read(sv[1], &got, sizeof(got)) < 0)
		got = -1;
	close(sv[0]);
	close(sv[1]);
	return got == id ? 0 : -1;
}

__attribute__((noinline)) void notify_workers(void)
{
	int p[2];
	if (pipe(p) == 0) {
		close(p[0]);
		close(p[1]);
	}
	int e = eventfd(0, 0);
	if (e >= 0)
		close(e);
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 50);
	long fail_every = arg_long(argc, argv, 2, 5);
	struct rlimit nofile;
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) { /* room for minutes of leaking */
		nofile.rlim_cur = nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
	ready();
	for (long id = 1;; id++) {
		if (fail_every > 0 && id % fail_every == 0)
			handshake_fails(id);
		else
			serve_session(id);
		notify_workers();
		sleep_ms(1000 / rate);
	}
}
