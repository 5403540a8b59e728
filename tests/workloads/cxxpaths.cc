// Two call paths through one allocation wrapper (operator new), built by the tests without frame
// pointers (-O2 -fomit-frame-pointer) as most C++ is shipped: OrderDesk::take() news a Session and
// drops 1 in 5 on an error branch (a leak); Journal::append() news an Entry and keeps every one in
// a global vector (held growth). Through malloc the two paths look alike to a frame-pointer walk.
// usage: cxxpaths [calls_per_second=2000]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>
#include <vector>

struct Session {
	long id;
	char pad[104];
};

struct Entry {
	long id;
	char pad[200];
};

static std::vector<Entry *> journal;
static volatile long sink;

__attribute__((noinline)) bool take(long id)
{
	Session *s = new Session;
	s->id = id;
	std::memset(s->pad, (int)id, sizeof(s->pad));
	sink += s->pad[id % sizeof(s->pad)];
	if (id % 5 == 0)
		return false; // the error branch: s is dropped, never deleted
	delete s;
	return true;
}

__attribute__((noinline)) void append(long id)
{
	Entry *e = new Entry;
	e->id = id;
	std::memset(e->pad, (int)id, sizeof(e->pad));
	journal.push_back(e);
}

int main(int argc, char **argv)
{
	long rate = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 2000;
	long per_tick = rate / 10 > 0 ? rate / 10 : 1;
	std::printf("ready %d\n", (int)getpid());
	std::fflush(stdout);
	for (long id = 0;;) {
		for (long i = 0; i < per_tick; i++, id++) {
			take(id);
			if (id % 4 == 0)
				append(id);
		}
		struct timespec ts = {0, 100000000L};
		nanosleep(&ts, nullptr);
	}
}
