/* memfds no tmpfs mount lists: render_frame() makes an anonymous file (memfd_create), fills it
 * and closes it once sent, but keeps every Nth open (a frame whose send failed): its pages stay
 * shared memory held by the descriptor, in the process's descriptors and in no mount.
 * usage: memfdleak [frames_per_second=20] [frame_bytes=262144] [N=2] */
#define _GNU_SOURCE
#include "common.h"
#include <sys/mman.h>

__attribute__((noinline)) int render_frame(long id, long bytes, long n)
{
	char name[64];
	snprintf(name, sizeof(name), "frame-%ld", id);
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return -1;
	char block[4096];
	memset(block, (int)(id % 251) + 1, sizeof(block));
	for (long done = 0; done < bytes; done += sizeof(block))
		if (write(fd, block, sizeof(block)) < 0)
			break;
	if (id % n == 0)
		return fd; /* the send failed and the descriptor is forgotten */
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 20), bytes = arg_long(argc, argv, 2, 262144), n = arg_long(argc, argv, 3, 2);
	ready();
	for (long id = 1;; id++) {
		render_frame(id, bytes, n);
		sleep_ms(1000 / rate);
	}
}
