/* A service that loads its lookup tables once at start-up (MIB MiB over about SECONDS s, after its
 * ready line), then holds them and answers lookups with a little short-lived memory each.
 * startup MIB SECONDS */
#include "acc.h"

static char **tables;

__attribute__((noinline)) static void load_tables(long mib, long seconds)
{
	tables = calloc(mib, sizeof *tables);
	for (long i = 0; i < mib; i++) {
		tables[i] = malloc(1 << 20);
		memset(tables[i], (int)i, 1 << 20);
		nap_ms(seconds * 1000 / mib);
	}
}

__attribute__((noinline)) static long answer_lookup(long key, long mib)
{
	char *scratch = malloc(512 + key % 1024);
	memcpy(scratch, tables[key % mib] + key % 4096, 512);
	long v = scratch[key % 512];
	free(scratch);
	return v;
}

int main(int argc, char **argv)
{
	long mib = arg(argc, argv, 1, 96), seconds = arg(argc, argv, 2, 4);
	volatile long sink = 0;
	say_ready();
	load_tables(mib, seconds);
	for (long key = 0;; key++) {
		sink += answer_lookup(key, mib);
		if (key % 200 == 0)
			nap_ms(10);
	}
}
