/* File I/O through the page cache. logwriter MODE PATH MIB:
 *   append: appends 4 MiB/s to PATH, never read back (page cache fills up to whatever bound);
 *   rotate: the same, but the file is deleted and started again every MIB MiB (its cache freed);
 *   reread: writes a MIB MiB file once (before the ready line), then reads it through again and
 *           again (a working set of files larger than the memory it is allowed: refaults). */
#include <fcntl.h>
#include "acc.h"

static char buf[1 << 20];

__attribute__((noinline)) static void append_log(int fd, long n)
{
	memset(buf, 'a' + (int)(n % 26), sizeof buf);
	if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf)
		exit(1);
}

__attribute__((noinline)) static long reread_file(const char *path)
{
	int fd = open(path, O_RDONLY);
	long sum = 0;
	ssize_t got;
	while ((got = read(fd, buf, sizeof buf)) > 0)
		sum += buf[got - 1];
	close(fd);
	return sum;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "append";
	const char *path = argc > 2 ? argv[2] : "/var/tmp/acc-log";
	long mib = arg(argc, argv, 3, 64);
	volatile long sink = 0;
	if (!strcmp(mode, "reread")) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		for (long i = 0; i < mib; i++)
			append_log(fd, i);
		close(fd);
		say_ready();
		for (;;)
			sink += reread_file(path);
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	say_ready();
	for (long n = 1;; n++) {
		append_log(fd, n);
		if (!strcmp(mode, "rotate") && n % mib == 0) {
			close(fd);
			unlink(path);
			fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		}
		nap_ms(250);
	}
}
