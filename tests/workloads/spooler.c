/* The tmpfs spool no process's RSS shows: spool_job() writes each job to DIR/job-ID.spool and
 * unlinks it once done; a failed job is left behind. Files written to tmpfs and closed are shared
 * memory (the host's Shmem, the writer's cgroup's shmem) until someone unlinks them.
 * usage: spooler DIR [jobs_per_second=50] [job_bytes=65536] [N=2] */
#include "common.h"
#include <fcntl.h>

__attribute__((noinline)) int spool_job(const char *dir, long id, long bytes, long n)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/job-%ld.spool", dir, id);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return -1;
	char block[4096];
	memset(block, (int)(id % 251) + 1, sizeof(block));
	for (long done = 0; done < bytes; done += sizeof(block))
		if (write(fd, block, sizeof(block)) < 0)
			break;
	close(fd);
	if (id % n == 0)
		return -1; /* failed: the spool file stays */
	unlink(path);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	long rate = arg_long(argc, argv, 2, 50), bytes = arg_long(argc, argv, 3, 65536), n = arg_long(argc, argv, 4, 2);
	ready();
	for (long id = 1;; id++) {
		spool_job(argv[1], id, bytes, n);
		sleep_ms(1000 / rate);
	}
}
