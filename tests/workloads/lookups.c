/* A slab cache that grows from a user action: find_config() stats a file that does not exist under
 * a new name each time (a cache key, a probe for an optional file), and the kernel keeps a negative
 * dentry for every name looked up. No heap grows; the dentry slab does, reclaimable but never
 * reclaimed while memory is plentiful.
 * usage: lookups DIR [lookups_per_second=20000] */
#include "common.h"
#include <sys/stat.h>

__attribute__((noinline)) int find_config(const char *dir, long id)
{
	char path[512];
	struct stat st;
	/* the pid in the name: a name looked up before (an earlier run) has its dentry already */
	snprintf(path, sizeof(path), "%s/optional-%d-%ld.conf", dir, (int)getpid(), id);
	return stat(path, &st);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	long rate = arg_long(argc, argv, 2, 20000);
	ready();
	for (long id = 1;; id++) {
		find_config(argv[1], id);
		if (id % (rate / 100) == 0)
			sleep_ms(10);
	}
}
