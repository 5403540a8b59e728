// An index that only grows, built before anyone traces it: g_index (a global std::map in .bss)
// gets PREBUILT records at start, then RATE a second, none ever removed. Its keys are scattered, so
// each record added later hangs in a tree node under nodes (and the map's header) that were
// allocated before memleak attached: the holder is g_index, through memory no trace saw allocated.
// usage: prebuilt [records_per_second=1000] [prebuilt=4000]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <unistd.h>

struct Record {
	long id;
	char body[200];
};

struct Entry { // 24 bytes: under glibc its last word is the next chunk's prev_size
	long id;
	long version;
	Record *record;
};

static std::map<long, Entry *> g_index;

__attribute__((noinline)) void index_record(long id)
{
	Record *r = new Record;
	r->id = id;
	std::memset(r->body, 'r', sizeof(r->body));
	Entry *e = new Entry{id, 1, r};
	g_index[(id * 7919) % 1000003] = e; // scattered keys: new nodes land deep in the old tree
}

int main(int argc, char **argv)
{
	long rate = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 1000;
	long prebuilt = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 4000;
	long per_tick = rate / 10 > 0 ? rate / 10 : 1;
	long id = 0;
	for (; id < prebuilt; id++)
		index_record(id);
	std::printf("ready %d\n", (int)getpid());
	std::fflush(stdout);
	for (;;) {
		for (long i = 0; i < per_tick; i++, id++)
			index_record(id);
		struct timespec ts = {0, 100000000L};
		nanosleep(&ts, nullptr);
	}
}
