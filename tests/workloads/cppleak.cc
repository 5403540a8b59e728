// A C++ leak through operator new: OrderBook::record() keeps every Order it news, while
// OrderBook::quote() news and deletes a scratch buffer. libstdc++'s operator new keeps no frame
// pointer, so a frame-pointer walk from inside it skips record(); the probes must not.
// usage: cppleak [KiB_per_second=2048]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>
#include <vector>

struct Order {
	long id;
	char payload[4088];
};

class OrderBook {
public:
	__attribute__((noinline)) void record(long id)
	{
		Order *o = new Order;
		o->id = id;
		std::memset(o->payload, (int)id, sizeof(o->payload));
		history_.push_back(o); // never deleted
	}
	__attribute__((noinline)) long quote(long id)
	{
		char *scratch = new char[512];
		std::memset(scratch, 1, 512);
		long v = scratch[id % 512];
		delete[] scratch;
		return v;
	}

private:
	std::vector<Order *> history_;
};

int main(int argc, char **argv)
{
	long kib = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 2048;
	long per_tick = kib / 4 / 10 > 0 ? kib / 4 / 10 : 1;
	OrderBook book;
	std::printf("ready %d\n", (int)getpid());
	std::fflush(stdout);
	for (long id = 0;; ) {
		for (long i = 0; i < per_tick; i++, id++) {
			book.record(id);
			book.quote(id);
		}
		struct timespec ts = {0, 100000000L};
		nanosleep(&ts, nullptr);
	}
}
