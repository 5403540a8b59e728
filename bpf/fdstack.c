/* fdstack: the file descriptors that hold kernel memory (sockets, pipes, eventfds, epoll and
 * inotify instances, memfds, timerfds, signalfds) by the user stack that created them, and which
 * of them were closed: what is still open at the end, by stack, is a descriptor leak's culprit.
 *
 * On the raw syscall tracepoints, as mmapsnoop and brkstack: sys_exit of a creating call that
 * succeeded records each new descriptor (two for socketpair and pipe, read from the caller's
 * array) under its stack; sys_enter of close() forgets it and counts a close for that stack
 * (at entry: once close() runs, another thread may be given the same number). The loader passes
 * the syscall numbers (NR_*) and MAX_FDS, the room of the table of open descriptors.
 * Map lookups stay in this file: bcc rewrites them only in the main source. */
#include "memdiag.h"

#ifndef MAX_FDS
#define MAX_FDS 65536
#endif

struct fd_key {
	u32 tgid;
	s32 stack_id;
	u64 ip;
	u64 at_sp;
	u32 kind; /* enum fd_kind */
	u32 pad;
};

struct fd_val {
	u64 created;
	u64 closed;
	u64 replaced; /* recorded open, then given out again: closed by a call not traced (dup2 ...) */
};

struct fd_id {
	u32 tgid;
	s32 fd;
};

struct fd_open {
	struct fd_key key;
	u64 ts; /* bpf_ktime_get_ns() at its creation (CLOCK_MONOTONIC) */
};

BPF_HASH(targets, u32, u8, 4096);
BPF_STACK_TRACE(stacks, 4096);
BPF_HASH(counts, struct fd_key, struct fd_val, 4096);
/* grows with use: a quiet target costs a few entries, a leaking one at most MAX_FDS */
BPF_F_TABLE("hash", struct fd_id, struct fd_open, fds, MAX_FDS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct fd_key, struct stack_sample, samples, 512, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_ARRAY(stats, u64, FD_ST_COUNT);

/* The kind of descriptor a system call creates; -1 for calls that create none of these. */
static __always_inline int kind_of(u64 nr)
{
	switch (nr) {
	case NR_SOCKET:
		return FD_KIND_SOCKET;
	case NR_SOCKETPAIR:
		return FD_KIND_SOCKETPAIR;
	case NR_ACCEPT:
	case NR_ACCEPT4:
		return FD_KIND_ACCEPTED;
	case NR_PIPE:
	case NR_PIPE2:
		return FD_KIND_PIPE;
	case NR_EVENTFD:
	case NR_EVENTFD2:
		return FD_KIND_EVENTFD;
	case NR_EPOLL_CREATE:
	case NR_EPOLL_CREATE1:
		return FD_KIND_EPOLL;
	case NR_INOTIFY_INIT:
	case NR_INOTIFY_INIT1:
		return FD_KIND_INOTIFY;
	case NR_MEMFD_CREATE:
		return FD_KIND_MEMFD;
	case NR_TIMERFD_CREATE:
		return FD_KIND_TIMERFD;
	case NR_SIGNALFD:
	case NR_SIGNALFD4:
		return FD_KIND_SIGNALFD;
	}
	return -1;
}

RAW_TRACEPOINT_PROBE(sys_enter)
{
	if (ctx->args[1] != NR_CLOSE)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	u64 fd = 0;
	bpf_probe_read_kernel(&fd, sizeof(fd), &regs->SYSCALL_ARG1);
	/* only the targets' descriptors are in the table: its look-up is the target filter */
	struct fd_id id = { .tgid = current_pid_tgid() >> 32, .fd = fd };
	struct fd_open *o = fds.lookup(&id);
	if (!o)
		return 0;
	struct fd_key key = o->key;
	if (fds.delete(&id) != 0)
		return 0; /* another thread's close() of the same number took it first */
	stats.increment(FD_ST_CLOSED);
	struct fd_val *v = counts.lookup(&key);
	if (v)
		__sync_fetch_and_add(&v->closed, 1);
	return 0;
}

/* Record one new descriptor under its stack's key; one the table has no room for is counted. */
static __always_inline void track(u32 tgid, s32 fd, struct fd_key *key, u64 ts)
{
	if (fd < 0)
		return;
	struct fd_id id = { .tgid = tgid, .fd = fd };
	struct fd_open o = { .key = *key, .ts = ts };
	struct fd_open *old = fds.lookup(&id);
	if (old) { /* the number was closed by a call not traced and is given out again */
		struct fd_key was = old->key;
		struct fd_val *v = counts.lookup(&was);
		if (v)
			__sync_fetch_and_add(&v->replaced, 1);
	}
	if (fds.update(&id, &o) != 0)
		stats.increment(FD_ST_FDS_DROPPED);
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
	long ret = ctx->args[1];
	if (ret < 0)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	u64 nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &regs->SYSCALL_NR);
	int kind = kind_of(nr);
	if (kind < 0)
		return 0;
	u32 tgid = current_pid_tgid() >> 32;
#if TARGET_MODE == 1
	if (!targets.lookup(&tgid))
		return 0;
#endif
	s32 pair[2] = { ret, -1 };
	if (nr == NR_SOCKETPAIR || nr == NR_PIPE || nr == NR_PIPE2) {
		/* the two descriptors are in the caller's int[2]: socketpair's 4th argument, pipe's 1st */
		u64 array = 0;
		if (nr == NR_SOCKETPAIR)
			bpf_probe_read_kernel(&array, sizeof(array), &regs->SYSCALL_ARG4);
		else
			bpf_probe_read_kernel(&array, sizeof(array), &regs->SYSCALL_ARG1);
		if (bpf_probe_read_user(pair, sizeof(pair), (void *)array) != 0)
			pair[0] = pair[1] = -1;
	}
	u64 made = (pair[0] >= 0) + (pair[1] >= 0);
	if (!made)
		return 0;
	stats.increment(FD_ST_CREATED, made);
	int zero = 0;
	struct stack_sample *s = scratch.lookup(&zero);
	if (!s)
		return 0;
	read_user_regs(&s->regs, regs);
	struct fd_key key = { .tgid = tgid, .ip = s->regs.ip, .kind = kind };
	key.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (key.stack_id < 0)
		stats.increment(FD_ST_STACK_ERRORS);
	bpf_probe_read_user(&key.at_sp, sizeof(key.at_sp), (void *)s->regs.sp);
	struct fd_val fresh = {}, *v = counts.lookup(&key);
	if (!v) {
		if (counts.insert(&key, &fresh) != 0) {
			stats.increment(FD_ST_KEYS_DROPPED, made);
			return 0;
		}
		v = counts.lookup(&key);
		if (!v)
			return 0;
		copy_user_stack(s);
		if (samples.insert(&key, s) != 0)
			stats.increment(FD_ST_SAMPLES_DROPPED);
	}
	__sync_fetch_and_add(&v->created, made);
	u64 ts = bpf_ktime_get_ns();
	track(tgid, pair[0], &key, ts);
	track(tgid, pair[1], &key, ts);
	return 0;
}
