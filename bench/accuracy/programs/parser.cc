// A message parser: parse_message builds a Message with new, and one message in FAIL_EVERY fails
// validation, which throws before the Message is handed to anyone: it is never deleted.
// parser RATE FAIL_EVERY
#include <memory>
#include <stdexcept>
#include <string>
#include "acc.h"

struct Message {
	long id;
	char body[1000];
};

static std::unique_ptr<Message> last;

__attribute__((noinline)) static Message *parse_message(long id, long fail_every)
{
	auto *m = new Message;
	m->id = id;
	memset(m->body, 'p', sizeof m->body);
	if (fail_every && id % fail_every == 0)
		throw std::runtime_error("bad checksum");  // m is lost
	return m;
}

int main(int argc, char **argv)
{
	long rate = arg(argc, argv, 1, 1000), fail_every = arg(argc, argv, 2, 4);
	say_ready();
	for (long id = 1;;) {
		for (long i = 0; i < rate / 100; i++) {
			try {
				last.reset(parse_message(id++, fail_every));
			} catch (const std::exception &) {
			}
		}
		nap_ms(10);
	}
}
