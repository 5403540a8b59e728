/* A leak that ends in an exec: leak_before_exec() keeps every record it allocates until
 * SIGUSR1 comes, then the process execs the program its arguments name (same pid, a new image:
 * every block of the old image is gone with it, freed, not leaked).
 * usage: execleak PROGRAM [ARG...] */
#include "common.h"
#include <signal.h>

static volatile sig_atomic_t go_exec;

static void on_usr1(int sig)
{
	(void)sig;
	go_exec = 1;
}

__attribute__((noinline)) void *leak_before_exec(long id)
{
	long *o = malloc(4096);
	if (!o)
		return NULL;
	memset(o, (int)id, 4096); /* resident, as a real leak is */
	return o;                 /* dropped by the caller: never freed */
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	signal(SIGUSR1, on_usr1);
	ready();
	for (long id = 0; !go_exec; id++) {
		for (int i = 0; i < 5; i++)
			leak_before_exec(id);
		handle_request(id);
		sleep_ms(10);
	}
	execv(argv[1], argv + 1);
	return 1;
}
