/* rbp as an ordinary register, as -O2 code uses it: odd_alloc() calls malloc with rbp pointing at
 * a pair of words in its caller's frame that look like a frame record ([rbp] the next frame, 0;
 * [rbp+8] a "return address", different on every call). A frame-pointer walk from malloc then
 * yields a new stack on every call (the kernel's stack map fills, stack_errors climb), while the
 * call paths are two: open_session() drops 1 in 5 sessions (a leak) and log_entry() keeps every
 * entry in a global array (held). .eh_frame (the CFI written below) unwinds them right.
 * Built by the tests with -O2 -fomit-frame-pointer. usage: oddframe [calls_per_second=2000] */
#include "common.h"

#define ENTRIES (1 << 20)

void *entries[ENTRIES]; /* not static: a store the compiler could prove unread would be dropped */
static long n_entries;
static volatile long sink;

__attribute__((noinline)) void *odd_alloc(size_t n, unsigned long *record)
{
	void *p;
	/* a leaf to the compiler: rsp is 8 below 16-byte alignment here, so the push realigns it */
	__asm__ volatile("push %%rbp\n\t"
			 ".cfi_adjust_cfa_offset 8\n\t"
			 ".cfi_rel_offset %%rbp, 0\n\t"
			 "mov %[record], %%rbp\n\t"
			 "call malloc@PLT\n\t"
			 "pop %%rbp\n\t"
			 ".cfi_adjust_cfa_offset -8\n\t"
			 ".cfi_restore %%rbp\n\t"
			 : "=a"(p)
			 : "D"(n), [record] "r"(record)
			 : "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "memory", "cc");
	return p;
}

__attribute__((noinline)) long open_session(long id)
{
	unsigned long record[2] = { 0, 0x10000000UL + (unsigned long)id * 64 };
	char *s = odd_alloc(112, record);
	memset(s, (int)id, 112);
	long v = s[id % 112];
	if (id % 5 == 0)
		return v; /* the error branch: s is dropped */
	free(s);
	return v;
}

__attribute__((noinline)) void log_entry(long id)
{
	unsigned long record[2] = { 0, 0x20000000UL + (unsigned long)id * 64 };
	char *e = odd_alloc(208, record);
	memset(e, (int)id, 208);
	if (n_entries < ENTRIES)
		entries[n_entries++] = e;
}

int main(int argc, char **argv)
{
	long rate = arg_long(argc, argv, 1, 2000);
	long per_tick = rate / 10 > 0 ? rate / 10 : 1;

	ready();
	for (long id = 1;;) {
		for (long i = 0; i < per_tick; i++, id++) {
			sink += open_session(id);
			if (id % 4 == 0)
				log_entry(id);
		}
		sleep_ms(100);
	}
}
