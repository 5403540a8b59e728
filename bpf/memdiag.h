/* Shared between memdiag's BPF programs and their loaders: the structs both sides read and the
 * helpers that touch no map (bcc rewrites map calls only in the main file, so maps and their
 * lookups stay in each probe's .c).
 *
 * Options arrive as -D defines from the loader (cflags):
 *   TARGET_MODE    0 = every process, 1 = only the tgids in the probe's `targets` map
 *   STACK_CHUNKS   user stack copied per sampled stack, in 512-byte chunks (default 16 = 8 KiB)
 *   PIDNS_DEV, PIDNS_INO  the pid namespace /proc numbers processes in, when it is not the initial
 *                  one (memdiag in a container): ids are then given in it (current_pid_tgid)
 */
#ifndef MEMDIAG_H
#define MEMDIAG_H

#include <uapi/linux/ptrace.h>

/* The kernel's comm size (include/linux/sched.h), without including that header: it pulls in
 * most of the kernel's headers and costs bcc's compiler ~17 MiB and ~0.3 s per program. */
#ifndef TASK_COMM_LEN
#define TASK_COMM_LEN 16
#endif

#ifndef TARGET_MODE
#define TARGET_MODE 0
#endif
#ifndef STACK_CHUNKS
#define STACK_CHUNKS 16
#endif
#define STACK_CHUNK 512
#define STACK_BYTES (STACK_CHUNKS * STACK_CHUNK)

/* The current task's tgid (high half) and pid as memdiag's /proc numbers them. In a pid
 * namespace of memdiag's own, bpf_get_current_pid_tgid() would give the host's numbers, which
 * match no pid memdiag knows; a task outside that namespace gets 0 (no target has tgid 0). */
static __always_inline u64 current_pid_tgid(void)
{
#if defined(PIDNS_DEV) && defined(PIDNS_INO)
	struct bpf_pidns_info ns = {};
	if (bpf_get_ns_current_pid_tgid(PIDNS_DEV, PIDNS_INO, &ns, sizeof(ns)) != 0)
		return 0;
	return ((u64)ns.tgid << 32) | ns.pid;
#else
	return bpf_get_current_pid_tgid();
#endif
}

struct user_regs {
	u64 ip;
	u64 sp;
	u64 bp;
};

/* Registers and a copy of the user stack from sp, taken once per new stack key, so user space
 * can unwind frameless code (glibc, libstdc++) with .eh_frame. */
struct stack_sample {
	struct user_regs regs;
	u32 len; /* bytes of data[] that were readable */
	u32 pad;
	u8 data[STACK_BYTES];
};

/* Copy as much of the user stack from sp as is mapped: stop at the first chunk that cannot be
 * read (the top of the stack mapping is often only a few KiB above sp). */
static __always_inline void copy_user_stack(struct stack_sample *s)
{
	s->len = 0;
#pragma unroll
	for (int i = 0; i < STACK_CHUNKS; i++) {
		if (bpf_probe_read_user(&s->data[i * STACK_CHUNK], STACK_CHUNK,
					(void *)(s->regs.sp + i * STACK_CHUNK)) != 0)
			break;
		s->len += STACK_CHUNK;
	}
}

/* Each program's `stats` array, by index. probes/bpfstats.py mirrors these enums once, in this
 * order (tests/unit/test_bpf_stats.py checks that the two sides agree); nothing reads them by number. */
/* faults, mmapsnoop, brkstack: the events seen, and what sampling their stacks lost */
enum stack_stat {
	STACK_ST_EVENTS,
	STACK_ST_STACK_ERRORS,
	STACK_ST_SAMPLES_DROPPED,
	STACK_ST_KEYS_DROPPED,
	STACK_ST_PY_DROPPED, /* Python stacks: their table full (faults, mmapsnoop) */
	STACK_ST_COUNT
};
/* fdstack: descriptors created and closed, what sampling their stacks lost, and those the table of
 * open descriptors had no room for */
enum fd_stat {
	FD_ST_CREATED,
	FD_ST_CLOSED,
	FD_ST_STACK_ERRORS,
	FD_ST_SAMPLES_DROPPED,
	FD_ST_KEYS_DROPPED,
	FD_ST_FDS_DROPPED,
	FD_ST_COUNT
};
/* fdstack: what a descriptor is, by the call that made it (probes/fdstack.py mirrors it as FD_KINDS) */
enum fd_kind {
	FD_KIND_SOCKET,
	FD_KIND_SOCKETPAIR,
	FD_KIND_ACCEPTED,
	FD_KIND_PIPE,
	FD_KIND_EVENTFD,
	FD_KIND_EPOLL,
	FD_KIND_INOTIFY,
	FD_KIND_MEMFD,
	FD_KIND_TIMERFD,
	FD_KIND_SIGNALFD,
	FD_KIND_COUNT
};
/* kmemstack: slab allocations made in the targets' context, the frees of those it tracks, and what
 * it could not record */
enum kmem_stat {
	KMEM_ST_ALLOCS,
	KMEM_ST_FREES,
	KMEM_ST_STACK_ERRORS, /* the user stack could not be walked */
	KMEM_ST_KSTACK_ERRORS, /* the kernel stack could not be walked */
	KMEM_ST_SAMPLES_DROPPED,
	KMEM_ST_KEYS_DROPPED, /* allocations of a new stack key when the books were full: not counted */
	KMEM_ST_OBJS_DROPPED, /* allocations the table of outstanding objects had no room for */
	KMEM_ST_REUSED, /* an address tracked was allocated again without a free seen: the old one dropped */
	KMEM_ST_COUNT
};
/* shmwriter: creations of shared memory seen (tmpfs files, memfds, System V segments), the traced
 * unlinks of files it recorded, what sampling their stacks lost, and those its table had no room for */
enum shmw_stat {
	SHMW_ST_CREATED,
	SHMW_ST_REMOVED,
	SHMW_ST_STACK_ERRORS,
	SHMW_ST_SAMPLES_DROPPED,
	SHMW_ST_KEYS_DROPPED,
	SHMW_ST_MADE_DROPPED, /* creations the table of what was made had no room for */
	SHMW_ST_COUNT
};
/* shmwriter: what a creation made (probes/shmwriter.py mirrors it as KINDS) */
enum shmw_kind { SHMW_KIND_FILE, SHMW_KIND_MEMFD, SHMW_KIND_SYSV, SHMW_KIND_COUNT };
/* swapin, drsnoop: the events seen, and those a full table dropped */
enum table_stat { TABLE_ST_EVENTS, TABLE_ST_TABLE_FULL, TABLE_ST_COUNT };
/* oomkill */
enum oom_stat { OOM_ST_EVENTS, OOM_ST_STACK_ERRORS, OOM_ST_COUNT };
/* memleak */
enum memleak_stat {
	S_ALLOCS, S_FREES, S_STACK_ERRORS, S_ALLOCS_DROPPED, S_UNKNOWN_FREES, S_FAILED, S_SAMPLES_DROPPED,
	S_STACKS_DROPPED, S_SAMPLED_OUT, S_NESTED, S_PY_DROPPED, S_COUNT
};
/* sites (memleak narrowed to one function's call sites) */
enum site_stat {
	SS_HITS,
	SS_NULL,
	SS_STACK_ERRORS,
	SS_BLOCKS_DROPPED,
	SS_SAMPLES_DROPPED,
	SS_CALLS_DROPPED,
	SS_CALL_HITS, /* site_call_*: the calls' own probes */
	SS_FREES_EMULATED, /* site_free_emulated: free entry points whose instruction the kernel emulates */
	SS_FREES_STEPPED, /* site_free_stepped: the others */
	SS_FREED, /* frees of a traced block */
	SS_COUNT
};

/* --- kmemstack (bpf/kmemstack.c, read by probes/kmemstack.py) ------------------------------------
 * One stack key: the user stack of the target's code that made the call (as the other event-stack
 * probes key it: tgid, stack id, ip, the word at sp) and the kernel stack that allocated. */
#define KMEM_CACHE_NAME 32 /* bytes of a cache's name kept (slab names are short: "dentry", "kmalloc-64") */
struct kmem_key {
	u32 tgid;
	s32 stack_id; /* user stack (BPF_F_USER_STACK), < 0: not walked */
	u64 ip;
	u64 at_sp;
	s32 kstack_id; /* kernel stack, < 0: not walked */
	u32 pad;
};

/* The books of one stack key. outstanding_*: allocated during the run, tracked, and not freed yet. */
struct kmem_books {
	u64 allocs;
	u64 alloc_bytes;
	u64 frees; /* of its tracked objects, by any task (dentries are freed by RCU, by kswapd ...) */
	u64 freed_bytes;
	u64 outstanding_count;
	u64 outstanding_bytes;
	u64 untracked; /* allocations the table of outstanding objects had no room for */
	u64 accounted; /* allocations charged to a memory cgroup (SLAB_ACCOUNT caches, __GFP_ACCOUNT) */
	u64 size; /* bytes_alloc of its first allocation: a kmalloc's size class */
	char cache[KMEM_CACHE_NAME]; /* the cache its first kmem_cache_alloc named; empty: kmalloc */
};

/* One outstanding object, by its address. */
struct kmem_obj {
	struct kmem_key key;
	u64 bytes;
	u64 ts; /* bpf_ktime_get_ns() at its allocation (CLOCK_MONOTONIC) */
};

/* --- shmwriter (bpf/shmwriter.c, read by probes/shmwriter.py) -------------------------------------
 * One stack key, as the other event-stack probes key it, and the kind of thing it made. */
#define SHMW_PATH 160 /* bytes of a created path kept, its NUL included: a longer one is cut, never matched */
struct shmw_key {
	u32 tgid;
	s32 stack_id; /* user stack (BPF_F_USER_STACK), < 0: not walked */
	u64 ip;
	u64 at_sp;
	u32 kind; /* enum shmw_kind */
	u32 pad;
};

struct shmw_books {
	u64 created;
	u64 removed; /* files it made that the same process unlinked while traced */
};

/* One thing made, by what names it: a file by its path as the call gave it and, for a relative
 * path, the directory descriptor it is relative to (id; 0 for an absolute path, -100 the working
 * directory), a memfd by its descriptor and name, a System V segment by its shmid (path empty). */
struct shmw_id {
	u32 tgid;
	u32 kind;
	s64 id;
	char path[SHMW_PATH];
};

struct shmw_made {
	struct shmw_key key;
	u64 ts;      /* bpf_ktime_get_ns() at its creation (CLOCK_MONOTONIC) */
	s64 dirfd;   /* a file's openat directory (AT_FDCWD -100: the working directory) */
	u64 ipc_key; /* a System V segment's key */
	u64 size;    /* a System V segment's size as asked */
	u32 path_len; /* bytes bpf_probe_read_user_str copied, the NUL included; SHMW_PATH: maybe cut */
	u32 pad;
};

/* x86-64 only (memdiag/system/arch.py refuses other machines before anything is compiled): the
 * pt_regs fields below are x86-64's. A system call's arguments, by position (x86-64 syscall ABI). */
#define SYSCALL_ARG1 di
#define SYSCALL_ARG2 si
#define SYSCALL_ARG3 dx
#define SYSCALL_ARG4 r10
/* The system call's number, still in pt_regs when it returns (raw_syscalls:sys_exit gives no id). */
#define SYSCALL_NR orig_ax

/* User registers from a struct pt_regs in kernel memory (raw tracepoint arguments). ip, sp and
 * bp sit at the same offsets in every x86-64 kernel's pt_regs (FRED in 6.9 changed only cs/ss). */
static __always_inline void read_user_regs(struct user_regs *r, struct pt_regs *regs)
{
	bpf_probe_read_kernel(&r->ip, sizeof(r->ip), &regs->ip);
	bpf_probe_read_kernel(&r->sp, sizeof(r->sp), &regs->sp);
	bpf_probe_read_kernel(&r->bp, sizeof(r->bp), &regs->bp);
}

/* The same from a uprobe's own context (the user registers at the probed instruction). */
static __always_inline void uprobe_regs(struct user_regs *r, struct pt_regs *ctx)
{
	r->ip = PT_REGS_IP(ctx);
	r->sp = PT_REGS_SP(ctx);
	r->bp = PT_REGS_FP(ctx);
}

/* --- CPython frames (walked by bpf/pyframes.h, read back by probes/cpython) -------------------
 * One py_proc per traced CPython process, filled by user space from the interpreter's layout
 * (probes/cpython/layout.py: a table per version, or the _Py_DebugOffsets that CPython 3.13+
 * publishes at the start of _PyRuntime): where the thread states are and the offsets of the
 * fields walked. PY_FRAMES 1 compiles the walk into a probe. */
#ifndef PY_FRAMES
#define PY_FRAMES 0
#endif
#ifndef PY_MAX_FRAMES
#define PY_MAX_FRAMES 32 /* a power of two: indexes into frames[] are masked with it */
#endif
#ifndef PY_MAX_THREADS
#define PY_MAX_THREADS 64 /* thread states looked through for the current thread's */
#endif
#define PY_NO_FIELD 0xffff
#define PY_NO_OWNER 0xff
/* Bit 63 of a frame's instruction pointer (user addresses stay below 2^47): the last Python frame
 * that its _PyEval_EvalFrameDefault call runs (3.11: is_entry; 3.12+: the frame above a shim). */
#define PY_LAST_IN_CALL (1ULL << 63)
/* py_stack.flags */
#define PY_TRUNCATED 1   /* more than PY_MAX_FRAMES frames: the outermost are missing */
#define PY_READ_FAILED 2 /* a frame could not be read: the stack ends there */

struct py_proc {
	u64 interp_head;    /* address of _PyRuntime.interpreters.head (a PyInterpreterState *) */
	u16 interp_threads; /* PyInterpreterState.threads.head */
	u16 tstate_next;    /* PyThreadState.next */
	u16 tstate_tid;     /* PyThreadState.native_thread_id */
	u16 tstate_frame;   /* PyThreadState.cframe (3.11, 3.12) or .current_frame (3.13) */
	u16 cframe_frame;   /* _PyCFrame.current_frame; PY_NO_FIELD: tstate_frame is the frame */
	u16 frame_code;     /* _PyInterpreterFrame.f_code (3.13: f_executable) */
	u16 frame_previous; /* _PyInterpreterFrame.previous */
	u16 frame_instr;    /* _PyInterpreterFrame.prev_instr (3.13: instr_ptr) */
	u16 frame_entry;    /* _PyInterpreterFrame.is_entry (3.11); PY_NO_FIELD after */
	u16 frame_owner;    /* _PyInterpreterFrame.owner */
	u16 frame_globals;  /* _PyInterpreterFrame.f_globals */
	u8 owner_cstack;    /* FRAME_OWNED_BY_CSTACK (3.12+: a shim between C calls); PY_NO_OWNER before */
	u8 pad[1];
};

struct py_frame {
	u64 code;    /* the PyCodeObject * (user space checks its type before reading it) */
	u64 instr;   /* the frame's instruction pointer, | PY_LAST_IN_CALL */
	u64 globals; /* the frame's globals dict: a module's, or one exec() ran code in (twistd's .tac) */
};

struct py_stack {
	u32 depth; /* frames[] used, innermost first */
	u32 flags;
	struct py_frame frames[PY_MAX_FRAMES];
};

/* The thread state a thread's Python frames hang from, when it was looked for (0: none), and the
 * native_thread_id it holds: the thread's id in the target's own pid namespace, which user space
 * fills in where that is not the id BPF sees (a target in a container). */
struct py_thread {
	u64 tstate;
	u64 looked_ns;
	u64 native_tid;
};

#endif
