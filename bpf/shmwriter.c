/* shmwriter: who makes the shared memory that accumulates: files created with O_CREAT (open,
 * openat, openat2, creat), memfds (memfd_create) and System V segments (shmget with IPC_CREAT or
 * IPC_PRIVATE), each by the user stack that made it, with the path, descriptor or shmid that names
 * it; and the files the same process unlinks (unlink, unlinkat), forgotten again. A file written
 * to tmpfs and closed is in no process's RSS: what is still there at the end, by stack, names the
 * code that leaves it behind. User space keeps only what is on a tmpfs mount and still there.
 *
 * On the raw syscall tracepoints, as fdstack: sys_exit of a call that succeeded reads its arguments
 * from the saved user registers (still there at the exit) and its path with
 * bpf_probe_read_user_str, bounded to SHMW_PATH. The loader passes the syscall numbers (NR_*) and
 * MAX_MADE, the room of the table of things made. Map lookups stay in this file: bcc rewrites them
 * only in the main source. */
#include "memdiag.h"

#ifndef MAX_MADE
#define MAX_MADE 16384
#endif
#define O_CREAT_FLAG 0100    /* O_CREAT (asm-generic/fcntl.h) */
#define IPC_CREAT_FLAG 01000 /* IPC_CREAT (uapi/linux/ipc.h) */

BPF_HASH(targets, u32, u8, 4096);
BPF_STACK_TRACE(stacks, 4096);
BPF_HASH(counts, struct shmw_key, struct shmw_books, 4096);
/* grows with use: a quiet target costs a few entries, one that leaves files behind at most MAX_MADE */
BPF_F_TABLE("hash", struct shmw_id, struct shmw_made, made, MAX_MADE, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct shmw_key, struct stack_sample, samples, 512, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_PERCPU_ARRAY(names, struct shmw_id, 1);
BPF_ARRAY(stats, u64, SHMW_ST_COUNT);

/* The path a call named, into id->path (zeroed first: the whole key is compared); bytes copied. */
static __always_inline int read_path(struct shmw_id *id, u64 ptr)
{
	__builtin_memset(id->path, 0, sizeof(id->path));
	int n = bpf_probe_read_user_str(id->path, sizeof(id->path), (void *)ptr);
	return n > 0 ? n : 0;
}

#define AT_FDCWD_NR -100 /* AT_FDCWD (uapi/linux/fcntl.h) */

/* What a file's path is relative to, as part of its key: nothing (0) for an absolute path, else the
 * directory descriptor the call named (AT_FDCWD: the working directory), so that "data" made in
 * two folders are two files, and an unlink of "x" forgets the "x" of its own folder only. */
static __always_inline s64 folder_of(struct shmw_id *id, s64 dirfd)
{
	return id->path[0] == '/' ? 0 : dirfd;
}

/* A file the process unlinked: forgotten, and counted as removed for the stack that made it. */
static __always_inline int unlinked(struct shmw_id *id)
{
	struct shmw_made *m = made.lookup(id);
	if (!m)
		return 0;
	struct shmw_key key = m->key;
	if (made.delete(id) != 0)
		return 0;
	stats.increment(SHMW_ST_REMOVED);
	struct shmw_books *b = counts.lookup(&key);
	if (b)
		__sync_fetch_and_add(&b->removed, 1);
	return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
	long ret = ctx->args[1];
	if (ret < 0)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	u64 nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &regs->SYSCALL_NR);
	if (nr != NR_OPEN && nr != NR_OPENAT && nr != NR_OPENAT2 && nr != NR_CREAT && nr != NR_MEMFD_CREATE &&
	    nr != NR_SHMGET && nr != NR_UNLINK && nr != NR_UNLINKAT)
		return 0;
	u32 tgid = current_pid_tgid() >> 32;
#if TARGET_MODE == 1
	if (!targets.lookup(&tgid))
		return 0;
#endif
	u64 a1 = 0, a2 = 0, a3 = 0;
	bpf_probe_read_kernel(&a1, sizeof(a1), &regs->SYSCALL_ARG1);
	bpf_probe_read_kernel(&a2, sizeof(a2), &regs->SYSCALL_ARG2);
	bpf_probe_read_kernel(&a3, sizeof(a3), &regs->SYSCALL_ARG3);
	int zero = 0;
	struct shmw_id *id = names.lookup(&zero);
	if (!id)
		return 0;
	id->tgid = tgid;
	id->kind = SHMW_KIND_FILE;
	id->id = 0;
	struct shmw_made m = { .dirfd = -100 };
	u64 path = 0;
	switch (nr) {
	case NR_UNLINK:
		read_path(id, a1);
		id->id = folder_of(id, AT_FDCWD_NR);
		return unlinked(id);
	case NR_UNLINKAT:
		read_path(id, a2);
		id->id = folder_of(id, (s32)a1);
		return unlinked(id);
	case NR_CREAT:
		path = a1;
		break;
	case NR_OPEN:
		if (!(a2 & O_CREAT_FLAG))
			return 0;
		path = a1;
		break;
	case NR_OPENAT:
		if (!(a3 & O_CREAT_FLAG))
			return 0;
		path = a2;
		m.dirfd = (s32)a1;
		break;
	case NR_OPENAT2: {
		u64 flags = 0; /* struct open_how's first field */
		bpf_probe_read_user(&flags, sizeof(flags), (void *)a3);
		if (!(flags & O_CREAT_FLAG))
			return 0;
		path = a2;
		m.dirfd = (s32)a1;
		break;
	}
	case NR_MEMFD_CREATE:
		id->kind = SHMW_KIND_MEMFD;
		id->id = ret;
		path = a1;
		break;
	case NR_SHMGET:
		if (a1 != 0 && !(a3 & IPC_CREAT_FLAG))
			return 0; /* only IPC_PRIVATE (key 0) or IPC_CREAT may make a segment */
		id->kind = SHMW_KIND_SYSV;
		id->id = ret;
		m.ipc_key = a1;
		m.size = a2;
		break;
	default:
		return 0;
	}
	if (path)
		m.path_len = read_path(id, path);
	else
		__builtin_memset(id->path, 0, sizeof(id->path));
	if (id->kind == SHMW_KIND_FILE)
		id->id = folder_of(id, m.dirfd);
	stats.increment(SHMW_ST_CREATED);
	struct stack_sample *s = scratch.lookup(&zero);
	if (!s)
		return 0;
	read_user_regs(&s->regs, regs);
	struct shmw_key key = { .tgid = tgid, .ip = s->regs.ip, .kind = id->kind };
	key.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (key.stack_id < 0)
		stats.increment(SHMW_ST_STACK_ERRORS);
	bpf_probe_read_user(&key.at_sp, sizeof(key.at_sp), (void *)s->regs.sp);
	struct shmw_books fresh = {}, *b = counts.lookup(&key);
	if (!b) {
		if (counts.insert(&key, &fresh) != 0) {
			stats.increment(SHMW_ST_KEYS_DROPPED);
			return 0;
		}
		b = counts.lookup(&key);
		if (!b)
			return 0;
		copy_user_stack(s);
		if (samples.insert(&key, s) != 0)
			stats.increment(SHMW_ST_SAMPLES_DROPPED);
	}
	__sync_fetch_and_add(&b->created, 1);
	m.key = key;
	m.ts = bpf_ktime_get_ns();
	if (made.update(id, &m) != 0)
		stats.increment(SHMW_ST_MADE_DROPPED);
	return 0;
}
