/* A request loop with steady churn: each request allocates a buffer of a size between 64 B and
 * 64 KiB and a header, keeps the last 1024 responses (the oldest freed), nothing else.
 * requests RATE (0: an idle daemon that wakes once a second and does nothing) */
#include "acc.h"

static void *responses[1024];

__attribute__((noinline)) static long serve_request(long n)
{
	size_t size = 64 + (size_t)(n * 2654435761u) % (64 << 10);
	char *body = malloc(size), *head = malloc(128);
	memset(body, 'b', size < 512 ? size : 512);
	memset(head, 'h', 128);
	long v = body[n % (size < 512 ? size : 512)] + head[n % 128];
	free(head);
	free(responses[n % 1024]);
	responses[n % 1024] = body;
	return v;
}

int main(int argc, char **argv)
{
	long rate = arg(argc, argv, 1, 20000);
	volatile long sink = 0;
	say_ready();
	for (long n = 0;;) {
		if (!rate) {
			nap_ms(1000);
			continue;
		}
		for (long i = 0; i < rate / 100; i++)
			sink += serve_request(n++);
		nap_ms(10);
	}
}
