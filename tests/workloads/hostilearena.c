/* glibc malloc's bookkeeping made hostile in a live process, for a reader of it from outside
 * (probes/memleak/glibcheap.py) to be checked against: a second thread takes an arena of its own
 * (B, in a heap of HEAP_MAX, 64 MiB, aligned), then the main thread rewrites B's malloc_state
 * (glibc 2.27+, x86-64: top at 0x60, next at 0x870).
 *   loop: B's next points at B, so the arena list never comes back to main_arena;
 *   top: B's top points at a fake chunk claiming 1 TiB, at the start of an 8 MiB mapping;
 *   libc FILE: FILE (named libc.so.*, of any size) mapped whole, private and writable;
 *   tiles: 64 MiB of anonymous memory tiled with fake one-page mmapped chunks' headers (prev_size
 *   0, size 4096 | IS_MMAPPED), printed as "tiles ADDR" before the arena line.
 * Prints "ready PID", then "arena ADDR" (B's malloc_state) and sleeps; the thread stays alive.
 * usage: hostilearena MODE [FILE] */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define HEAP_MAX (64UL << 20)
#define TOP_AT 0x60
#define NEXT_AT 0x870

static volatile unsigned long arena;

static void *worker(void *arg)
{
	(void)arg;
	unsigned long p = (unsigned long)malloc(4000); /* the thread's first block: from its own arena */
	if (p) {
		unsigned long heap_info = p & ~(HEAP_MAX - 1);
		__atomic_store_n(&arena, *(unsigned long *)heap_info, __ATOMIC_RELEASE); /* heap_info.ar_ptr */
	}
	for (;;)
		sleep(60);
	return NULL;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "loop";
	pthread_t t;

	ready(); /* stdout's buffer allocated now, before the list is touched */
	if (pthread_create(&t, NULL, worker, NULL))
		return 1;
	while (!__atomic_load_n(&arena, __ATOMIC_ACQUIRE))
		sleep_ms(1);
	unsigned long b = arena;
	if (!strcmp(mode, "loop")) {
		*(unsigned long *)(b + NEXT_AT) = b;
	} else if (!strcmp(mode, "top")) {
		unsigned long *fake = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (fake == MAP_FAILED)
			return 1;
		fake[1] = (1UL << 40) | 1; /* size 1 TiB, PREV_INUSE */
		*(unsigned long *)(b + TOP_AT) = (unsigned long)fake;
	} else if (!strcmp(mode, "libc") && argc > 2) {
		int fd = open(argv[2], O_RDWR);
		struct stat st;
		if (fd < 0 || fstat(fd, &st))
			return 1;
		if (mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) == MAP_FAILED)
			return 1;
		close(fd);
	} else if (!strcmp(mode, "tiles")) {
		unsigned long size = 64UL << 20;
		unsigned char *tiles = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (tiles == MAP_FAILED)
			return 1;
		for (unsigned long at = 0; at < size; at += 4096)
			((unsigned long *)(tiles + at))[1] = 4096 | 2;
		printf("tiles %lu\n", (unsigned long)tiles);
	} else {
		return 2;
	}
	printf("arena %lu\n", b);
	fflush(stdout);
	for (;;)
		sleep(60);
}
