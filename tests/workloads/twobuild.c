/* One program, two builds: -DWHO=alpha or -DWHO=beta names its only working function
 * alpha_work or beta_work, so a symbolizer that reads the wrong build of a file at the same
 * path names the wrong function. Prints "ready PID ADDRESS" (the function's address in this
 * process) and waits in that function until killed. */
#include "common.h"

#ifndef WHO
#define WHO alpha
#endif
#define CAT(a, b) a##b
#define NAMED(w) CAT(w, _work)

__attribute__((noinline)) void NAMED(WHO)(void)
{
	for (;;)
		pause();
}

int main(void)
{
	printf("ready %d %p\n", (int)getpid(), (void *)&NAMED(WHO));
	fflush(stdout);
	NAMED(WHO)();
	return 0;
}
