// A product catalogue that only grows: every product seen is added to g_catalog and never removed.
// catalog RATE
#include <string>
#include <unordered_map>
#include <vector>
#include "acc.h"

struct Product {
	std::string sku;
	std::vector<char> description;
};

static std::unordered_map<long, Product *> g_catalog;  // the holder

__attribute__((noinline)) static void add_product(long id)
{
	auto *p = new Product{"sku-" + std::to_string(id), std::vector<char>(900, 'd')};
	g_catalog[id] = p;
}

int main(int argc, char **argv)
{
	long rate = arg(argc, argv, 1, 500);
	say_ready();
	for (long id = 1;;) {
		for (long i = 0; i < rate / 50; i++)
			add_product(id++);
		nap_ms(20);
	}
}
