/* A session table. sessions RATE CAP PREFILL: RATE sessions opened a second; CAP 0 keeps every
 * session for ever in `session_table` (held growth); CAP > 0 keeps the CAP most recent ones and
 * closes (frees) the oldest (an LRU at its bound once full); PREFILL 1 fills it to CAP before the
 * ready line (a cache already at its bound), 0 after (a cache warming up). */
#include "acc.h"

struct session {
	long id;
	char state[900];
};

static struct session **session_table; /* the holder */
static long table_len, table_cap;

__attribute__((noinline)) static struct session *open_session(long id)
{
	struct session *s = malloc(sizeof *s);
	if (!s)
		exit(1);
	s->id = id;
	memset(s->state, 's', sizeof s->state);
	return s;
}

__attribute__((noinline)) static void keep(struct session *s, long cap)
{
	if (cap == 0) {
		if (table_len == table_cap) {
			table_cap = table_cap ? table_cap * 2 : 1024;
			session_table = realloc(session_table, table_cap * sizeof *session_table);
		}
		session_table[table_len++] = s;
		return;
	}
	if (!session_table)
		session_table = calloc(cap, sizeof *session_table);
	long slot = s->id % cap;
	free(session_table[slot]); /* evict the least recently opened */
	session_table[slot] = s;
}

int main(int argc, char **argv)
{
	long rate = arg(argc, argv, 1, 500), cap = arg(argc, argv, 2, 0), prefill = arg(argc, argv, 3, 1);
	long id = 1;
	if (cap && prefill)
		while (id <= cap)
			keep(open_session(id++), cap);
	say_ready();
	for (;;) {
		for (long i = 0; i < rate / 50; i++)
			keep(open_session(id++), cap);
		nap_ms(20);
	}
}
