/* libdrop.so: a C library called from Python through ctypes (tests/workloads/pyctypes.py): take_record()
 * returns a filled block for the caller to give back, except that 1 in 7 calls loses it on an
 * error path and returns NULL (a leak: nothing points at the block). Built as a shared object. */
#include <stdlib.h>
#include <string.h>

static unsigned long calls;

__attribute__((noinline)) void *take_record(size_t size)
{
	char *p = malloc(size);
	if (p == NULL)
		return NULL;
	memset(p, 0x5a, size);
	if (++calls % 7 == 0)
		return NULL; /* the error path forgets p */
	return p;
}

void give_back(void *p)
{
	free(p);
}
