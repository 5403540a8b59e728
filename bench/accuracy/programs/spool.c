/* A spooler writing 256 KiB parts into tmpfs (DIR/acc-spool-PID-N.part), 10 a second.
 * spool DIR KEEP: KEEP 0 never unlinks them (tmpfs fills); KEEP N unlinks each part once N newer
 * ones exist (the consumer's job, done). */
#include <fcntl.h>
#include "acc.h"

static char block[256 << 10];

__attribute__((noinline)) static void spool_part(const char *dir, long n)
{
	char path[512];
	snprintf(path, sizeof path, "%s/acc-spool-%d-%ld.part", dir, (int)getpid(), n);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		exit(1);
	memset(block, (int)n, sizeof block);
	if (write(fd, block, sizeof block) != (ssize_t)sizeof block)
		exit(1);
	close(fd);
}

__attribute__((noinline)) static void consume_part(const char *dir, long n)
{
	char path[512];
	snprintf(path, sizeof path, "%s/acc-spool-%d-%ld.part", dir, (int)getpid(), n);
	unlink(path);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "/dev/shm";
	long keep = arg(argc, argv, 2, 0);
	say_ready();
	for (long n = 0;; n++) {
		spool_part(dir, n);
		if (keep && n >= keep)
			consume_part(dir, n - keep);
		nap_ms(100);
	}
}
