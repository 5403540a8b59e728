// The error-branch leak in C++, through operator new/delete: OrderDesk::take() news an Order,
// fills it and checks it; one order in N fails and take() returns false without deleting it,
// dropping the only pointer. The other orders are deleted, and OrderDesk::quote() news and
// deletes a scratch buffer.
// usage: errleak_cpp [orders_per_second=2000] [N=7]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>

struct Order {
	long id;
	long checksum;
	unsigned char payload[1008]; // 1 KiB in all
};

static volatile long sink; // sums land here, so the compiler keeps every new and memset

class OrderDesk {
public:
	explicit OrderDesk(long n) : n_(n > 0 ? n : 1) {}
	__attribute__((noinline)) bool take(long id)
	{
		Order *o = new Order{id, 0, {}};
		std::memset(o->payload, (int)(id % 251) + 1, sizeof(o->payload)); // resident
		if (!check(o))
			return false; // the error branch: o is dropped here, never deleted
		sink += o->checksum;
		delete o;
		return true;
	}
	__attribute__((noinline)) long quote(long id)
	{
		unsigned char *scratch = new unsigned char[512];
		std::memset(scratch, 1, 512);
		long v = ((volatile unsigned char *)scratch)[id % 512];
		delete[] scratch;
		return v;
	}

private:
	__attribute__((noinline)) bool check(Order *o)
	{
		long sum = 0;
		for (size_t i = 0; i < sizeof(o->payload); i += 64)
			sum += o->payload[i];
		o->checksum = sum;
		return o->id % n_ != 0; // 1 in n_ orders fails
	}
	long n_;
};

int main(int argc, char **argv)
{
	long rate = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 2000;
	long n = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 7;
	long per_tick = rate / 10 > 0 ? rate / 10 : 1; // 10 ticks a second
	OrderDesk desk(n);
	std::printf("ready %d\n", (int)getpid());
	std::fflush(stdout);
	for (long id = 1;;) {
		for (long i = 0; i < per_tick; i++, id++) {
			desk.take(id);
			sink += desk.quote(id);
		}
		struct timespec ts = {0, 100000000L};
		nanosleep(&ts, nullptr);
	}
}
