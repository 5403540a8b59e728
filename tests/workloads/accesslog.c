/* An access logger: log_request() appends a line per request to FILE and never reads it back.
 * In a memory-limited cgroup its page cache fills the limit and the kernel reclaims it: usage sits
 * at the limit, the working set stays small. Not a leak, not pressure.
 * usage: accesslog FILE [lines_per_second=20000] [line_bytes=512] */
#include "common.h"
#include <fcntl.h>

__attribute__((noinline)) long log_request(int fd, long id, char *line, long len)
{
	int n = snprintf(line, len, "%ld GET /orders/%ld 200 ", id, id * 7);
	memset(line + n, 'x', len - n - 1);
	line[len - 1] = '\n';
	return write(fd, line, len);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	long rate = arg_long(argc, argv, 2, 20000), len = arg_long(argc, argv, 3, 512);
	int fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (fd < 0)
		return 1;
	char *line = malloc(len);
	ready();
	for (long id = 1;; id++) {
		log_request(fd, id, line, len);
		if (id % (rate / 100) == 0)
			sleep_ms(10);
	}
}
