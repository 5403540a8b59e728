/* The descriptor leak no heap holds: open_session() makes a socket pair per session and writes a
 * greeting through it; one handshake in N fails and the error branch returns without closing the
 * pair. RSS stays flat; the kernel's socket objects (and the greeting's buffer) accumulate.
 * usage: sessions [sessions_per_second=200] [N=4] */
#include "common.h"
#include <sys/socket.h>

__attribute__((noinline)) int handshake(long id, long n)
{
	return id % n != 0; /* 1 in n fails */
}

__attribute__((noinline)) long open_session(long id, long n)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return -1;
	char hello[256];
	memset(hello, 'h', sizeof(hello));
	if (write(sv[0], hello, sizeof(hello)) < 0)
		return -1;
	if (!handshake(id, n))
		return -1; /* the error branch: both ends stay open, the greeting unread */
	char buf[256];
	long got = read(sv[1], buf, sizeof(buf));
	close(sv[0]);
	close(sv[1]);
	return got;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 200), n = arg_long(argc, argv, 2, 4);
	ready();
	for (long id = 1;; id++) {
		open_session(id, n);
		sleep_ms(1000 / rate);
	}
}
