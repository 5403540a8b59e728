/* A config watcher that probes for override files that never exist: every lookup of a missing
 * name leaves a negative dentry in the kernel's slab. negdent DIR RATE */
#include <sys/stat.h>
#include "acc.h"

__attribute__((noinline)) static int probe_override(const char *dir, long n)
{
	char path[512];
	struct stat st;
	snprintf(path, sizeof path, "%s/acc-override-%d-%ld.conf", dir, (int)getpid(), n);
	return stat(path, &st);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "/var/tmp";
	long rate = arg(argc, argv, 2, 5000);
	say_ready();
	for (long n = 0;;) {
		for (long i = 0; i < rate / 100; i++)
			probe_override(dir, n++);
		nap_ms(10);
	}
}
