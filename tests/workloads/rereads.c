/* A reader whose working set no longer fits: scan_index() reads FILE from start to end again and
 * again. In a cgroup whose limit is below the file's size, every pass evicts the pages the next
 * one needs: file pages come back as refaults, and the reader waits on the disk. Pressure, not cache.
 * usage: rereads FILE */
#include "common.h"
#include <fcntl.h>

__attribute__((noinline)) long scan_index(int fd, char *buf, long size)
{
	long sum = 0, n;
	for (off_t off = 0; (n = pread(fd, buf, size, off)) > 0; off += n)
		sum += buf[0];
	return sum;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	int fd = open(argv[1], O_RDONLY);
	if (fd < 0)
		return 1;
	long size = 1 << 20;
	char *buf = malloc(size);
	volatile long sink = 0;
	ready();
	for (;;)
		sink += scan_index(fd, buf, size);
}
