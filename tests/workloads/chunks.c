/* Blocks in every state glibc's malloc keeps them in, their addresses printed for a reader of its
 * chunk headers and free lists to be checked against: "kept SIZE ADDR" (allocated) and "freed SIZE
 * ADDR" (in a thread's cache, a fastbin, the unsorted bin, or unmapped), then "done"; it then sleeps.
 * A second thread (its own arena) keeps and frees blocks too, and stays alive. usage: chunks */
#include "common.h"
#include <pthread.h>

static void say(const char *what, size_t size, unsigned long p)
{
	printf("%s %zu %lu\n", what, size, p);
}

/* addresses taken before the free: the blocks are never used after it */
static volatile unsigned long thread_kept, thread_freed, thread_big_kept, thread_big_freed;
static void *volatile guards[16];
static volatile int thread_ready;

static void *worker(void *arg)
{
	(void)arg;
	thread_kept = (unsigned long)malloc(48);
	void *gone = malloc(48);
	thread_big_kept = (unsigned long)malloc(3000);
	void *big_gone = malloc(3000);
	guards[15] = malloc(3000);
	thread_freed = (unsigned long)gone;
	thread_big_freed = (unsigned long)big_gone;
	free(gone);
	free(big_gone);
	__atomic_store_n(&thread_ready, 1, __ATOMIC_RELEASE);
	for (;;)
		sleep(60);
	return NULL;
}

int main(void)
{
	static const size_t sizes[] = { 24, 100, 500, 2000, 50000 };
	pthread_t t;

	ready();
	if (pthread_create(&t, NULL, worker, NULL))
		return 1;
	while (!__atomic_load_n(&thread_ready, __ATOMIC_ACQUIRE))
		sleep_ms(1);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		void *keep = malloc(sizes[i]), *gone = malloc(sizes[i]);
		guards[i] = malloc(sizes[i]); /* keeps the freed one from merging into the top */
		memset(keep, 1, sizes[i]);
		unsigned long was = (unsigned long)gone;
		free(gone);
		say("kept", sizes[i], (unsigned long)keep);
		say("freed", sizes[i], was);
	}
	/* mmapped (over the 128 KiB threshold): one kept, one unmapped */
	void *big = malloc(300000), *big_gone = malloc(300000);
	unsigned long was = (unsigned long)big_gone;
	free(big_gone);
	say("kept", 300000, (unsigned long)big);
	say("freed", 300000, was);
	/* freed and handed out again: the address is allocated (to its new owner) */
	void *again = malloc(700);
	was = (unsigned long)again;
	free(again);
	void *now = malloc(700);
	say((unsigned long)now == was ? "kept" : "freed", 700, was);
	/* ten of one small size freed: seven fill its tcache bin, the rest go to a fastbin */
	unsigned long small[10];
	for (int i = 0; i < 10; i++)
		small[i] = (unsigned long)malloc(40);
	void *small_kept = malloc(40);
	for (int i = 0; i < 10; i++)
		free((void *)small[i]);
	for (int i = 0; i < 10; i++)
		say("freed", 40, small[i]);
	say("kept", 40, (unsigned long)small_kept);
	say("kept", 48, thread_kept);
	say("freed", 48, thread_freed);
	say("kept", 3000, thread_big_kept);
	say("freed", 3000, thread_big_freed);
	printf("done\n");
	fflush(stdout);
	for (;;)
		sleep(60);
}
