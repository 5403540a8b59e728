/* A process that holds more and more (MIB MiB every 200 ms, touched) until its cgroup's limit kills
 * it. oomhog MIB [restart]: with "restart", a supervisor forks the hog again 1 s after each death. */
#include <sys/wait.h>
#include "acc.h"

__attribute__((noinline)) static void hoard_blocks(long mib)
{
	for (;;) {
		char *p = malloc(mib << 20);
		if (p)
			memset(p, 1, mib << 20);
		nap_ms(200);
	}
}

int main(int argc, char **argv)
{
	long mib = arg(argc, argv, 1, 2);
	int restart = argc > 2 && !strcmp(argv[2], "restart");
	say_ready();
	if (!restart)
		hoard_blocks(mib);
	for (;;) {
		pid_t child = fork();
		if (child == 0)
			hoard_blocks(mib);
		waitpid(child, NULL, 0);
		nap_ms(1000);
	}
}
