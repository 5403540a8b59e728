/* A supervisor, as systemd's Restart=always or a shell loop: runs PROGRAM ARGS, and again each
 * time it ends (an OOM kill, say), a tenth of a second later.
 * usage: supervise PROGRAM [ARGS...] */
#include "common.h"
#include <sys/wait.h>

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	ready();
	for (;;) {
		pid_t pid = fork();
		if (pid == 0) {
			execv(argv[1], argv + 1);
			_exit(127);
		}
		if (pid < 0)
			return 1;
		int status;
		while (waitpid(pid, &status, 0) < 0)
			;
		sleep_ms(100);
	}
}
