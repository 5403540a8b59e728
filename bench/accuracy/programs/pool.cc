// An object pool: connections are taken from a free list and given back; the pool grows only when
// empty, which happens at start-up alone. Steady work, nothing grows. pool RATE
#include <vector>
#include "acc.h"

struct Conn {
	long id;
	char buf[4096];
};

static std::vector<Conn *> free_list;

__attribute__((noinline)) static Conn *acquire_conn()
{
	if (free_list.empty())
		return new Conn;
	Conn *c = free_list.back();
	free_list.pop_back();
	return c;
}

__attribute__((noinline)) static void release_conn(Conn *c)
{
	free_list.push_back(c);
}

int main(int argc, char **argv)
{
	long rate = arg(argc, argv, 1, 20000);
	std::vector<Conn *> busy;
	say_ready();
	for (long n = 0;;) {
		for (long i = 0; i < rate / 100; i++, n++) {
			Conn *c = acquire_conn();
			c->id = n;
			memset(c->buf, (int)n, 256);
			busy.push_back(c);
			if (busy.size() > 64) {
				release_conn(busy.front());
				busy.erase(busy.begin());
			}
		}
		nap_ms(10);
	}
}
