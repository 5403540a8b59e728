/* memleak: outstanding allocations by stack, aggregated in the kernel.
 *
 * User mode (KERNEL_MODE 0): uprobes on the allocator the target actually uses, placed by the
 * loader on an instruction the kernel emulates where the function's prologue has one, attached
 * to the target's pids only. Per stack: outstanding bytes and count, allocations and frees.
 * Every outstanding allocation remembers its stack key and time, so a free moves the stack's
 * books and user space can tell the age of the oldest one.
 * Kernel mode (KERNEL_MODE 1): the kmem tracepoints (kmalloc/kfree, kmem_cache_alloc/free,
 * mm_page_alloc/free) with kernel stacks.
 *
 * Defines from the loader: MIN_SIZE, MAX_SIZE (size filter), SAMPLE_EVERY (1 in N),
 * SNOOP_MIN (report single allocations at least this big, 0 = off), MAX_ALLOCS, MAX_STACKS,
 * PY_FRAMES (1: record the Python stack of targets in py_procs, bpf/pyframes.h).
 * Known traps handled: a NULL return is not outstanding; in-flight state is per thread (keyed by
 * the full pid_tgid); realloc and mremap move an allocation instead of duplicating it; frees of
 * allocations made before attach are counted apart, not subtracted; mmap/mremap called from
 * inside the allocator (its own large chunks) are not counted twice. */
#include "memdiag.h"
#include "pyframes.h"

#ifndef KERNEL_MODE
#define KERNEL_MODE 0
#endif
#ifndef MIN_SIZE
#define MIN_SIZE 0
#endif
#ifndef MAX_SIZE
#define MAX_SIZE 0xffffffffffffffffULL
#endif
#ifndef SAMPLE_EVERY
#define SAMPLE_EVERY 1
#endif
#ifndef SNOOP_MIN
#define SNOOP_MIN 0
#endif
#ifndef MAX_ALLOCS
#define MAX_ALLOCS 262144
#endif
#ifndef MAX_STACKS
#define MAX_STACKS 4096
#endif

enum kind { K_MALLOC, K_REALLOC, K_MEMALIGN_PTR, K_MMAP, K_MREMAP };

struct stack_key {
	u32 tgid;
	s32 stack_id;
	u64 ip;
	u64 at_sp; /* the return address at sp, mixed with the path fingerprint where frames are missing */
};

/* The executable's text, per tgid (filled by the loader): return addresses into it tell apart the
 * call paths of frameless code (see path_fingerprint). */
struct text_range {
	u64 lo;
	u64 hi;
};

struct inflight {
	u64 size;
	u64 ptr_arg; /* realloc/mremap: the old pointer; posix_memalign: where the result goes */
	struct stack_key key;
	u32 kind;
	u32 depth; /* allocator calls nested in this one (realloc(NULL) calling malloc, tail calls) */
};

struct alloc_info {
	u64 size;
	u64 ts_ns;
	struct stack_key key;
};

struct stack_stats {
	u64 outstanding_bytes;
	u64 outstanding_count;
	u64 allocs;
	u64 frees;
	u64 alloc_bytes;
	u64 freed_bytes;
};

struct big_alloc {
	u64 ts_ns;
	u64 size;
	u64 addr;
	struct stack_key key;
	char comm[TASK_COMM_LEN];
};

BPF_HASH(targets, u32, u8, 4096);
BPF_HASH(inflight_map, u64, struct inflight, 10240);
BPF_F_TABLE("hash", u64, struct alloc_info, allocs, MAX_ALLOCS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct stack_key, struct stack_stats, per_stack, MAX_STACKS, BPF_F_NO_PREALLOC);
BPF_STACK_TRACE(stacks, MAX_STACKS);
BPF_F_TABLE("hash", struct stack_key, struct stack_sample, samples, 1024, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_PERF_OUTPUT(big);
BPF_ARRAY(stats, u64, S_COUNT);
BPF_HASH(texts, u32, struct text_range, 4096);
/* Armed by the loader once every uprobe is attached and disarmed before the maps are read, so
 * attaching and detaching one probe after another never leaves half a call on the books. */
BPF_ARRAY(control, u32, 1);
#if PY_FRAMES
/* py_procs, py_threads, py_scratch and py_now(): spliced in by probes/compiler.py (bpf/pynow.h) */
#include "pynow.h"
/* the Python stack of each stack key, recorded with its first stack copy */
BPF_F_TABLE("hash", struct stack_key, struct py_stack, pystacks, 1024, BPF_F_NO_PREALLOC);
#endif

static __always_inline int armed(void)
{
	int zero = 0;
	u32 *on = control.lookup(&zero);
	return on && *on;
}

static __always_inline void record_alloc(void *ctx, u64 addr, u64 size, struct stack_key *key)
{
	struct alloc_info info = { .size = size, .ts_ns = bpf_ktime_get_ns(), .key = *key };
	if (allocs.insert(&addr, &info) != 0) {
		/* full, or the address is already tracked (a missed free): replace to stay truthful */
		if (allocs.update(&addr, &info) != 0) {
			stats.increment(S_ALLOCS_DROPPED);
			return;
		}
	}
	struct stack_stats zero = {};
	struct stack_stats *s = per_stack.lookup_or_try_init(key, &zero);
	if (!s) {
		stats.increment(S_STACKS_DROPPED);
		return;
	}
	__sync_fetch_and_add(&s->outstanding_bytes, size);
	__sync_fetch_and_add(&s->outstanding_count, 1);
	__sync_fetch_and_add(&s->allocs, 1);
	__sync_fetch_and_add(&s->alloc_bytes, size);
	stats.increment(S_ALLOCS);
#if SNOOP_MIN > 0
	if (size >= SNOOP_MIN) {
		struct big_alloc b = { .ts_ns = info.ts_ns, .size = size, .addr = addr, .key = *key };
		bpf_get_current_comm(&b.comm, sizeof(b.comm));
		big.perf_submit(ctx, &b, sizeof(b));
	}
#endif
}

static __always_inline int record_free(u64 addr)
{
	struct alloc_info *info = allocs.lookup(&addr);
	if (!info)
		return 0; /* allocated before attach, sampled out, or not an allocation of ours */
	struct stack_stats *s = per_stack.lookup(&info->key);
	if (s) {
		__sync_fetch_and_sub(&s->outstanding_bytes, info->size);
		__sync_fetch_and_sub(&s->outstanding_count, 1);
		__sync_fetch_and_add(&s->frees, 1);
		__sync_fetch_and_add(&s->freed_bytes, info->size);
	}
	allocs.delete(&addr);
	stats.increment(S_FREES);
	return 1;
}

#if KERNEL_MODE == 0

#define FINGERPRINT_WORDS 32
#define NO_FRAME_POINTERS -1 /* a stack key's stack_id where the frame-pointer walk was not taken */
#define FINGERPRINT_RETURNS 4

/* Whether the kernel's frame-pointer walk from here means anything: rbp points a little above sp
 * and the word after it is a return address into the executable. In -O2 code rbp is an ordinary
 * register that often holds a stack address; walked as a frame chain it yields a different garbage
 * stack on nearly every call (redis-server: 3,500 stack ids for one call site in 6 s), which filled
 * the stack map (stack_errors) and the one-copy-per-key samples map (samples_dropped), leaving
 * those allocations with the allocator's frame alone. A return address into a library is not
 * trusted either (the libraries that allocate are frameless): the copy and .eh_frame name it. */
static __always_inline int frame_pointer_usable(struct stack_sample *s, u32 tgid)
{
	if (!(s->regs.bp > s->regs.sp && s->regs.bp - s->regs.sp < (1 << 20)))
		return 0;
	struct text_range *t = texts.lookup(&tgid);
	if (!t)
		return 1; /* no text range (the executable is not a file): trust it as before */
	u64 ra = 0;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(s->regs.bp + 8)) != 0)
		return 0;
	return ra >= t->lo && ra < t->hi;
}

/* Frameless code (glibc, libstdc++, most -O2 builds) leaves the frame-pointer walk with little
 * more than the allocator: every call path through one wrapper (operator new, xmalloc) would share
 * a stack key and the one stack copied for it, so a leak on one path and held growth on another
 * were booked to one stack. The first few return addresses into the executable found in the
 * words above sp differ between those paths. A stale one in an uninitialized slot can only split
 * a path in two, and user space merges stacks that unwind alike. Used only where the frame-pointer
 * walk is not (frame_pointer_usable): otherwise that walk already tells the paths apart. */
static __always_inline u64 path_fingerprint(struct stack_sample *s, u32 tgid)
{
	struct text_range *t = texts.lookup(&tgid);
	if (!t)
		return 0;
	if (bpf_probe_read_user(s->data, FINGERPRINT_WORDS * 8, (void *)s->regs.sp) != 0)
		return 0;
	u64 *words = (u64 *)s->data;
	u64 h = 0;
	int found = 0;
#pragma unroll
	for (int i = 1; i < FINGERPRINT_WORDS; i++) { /* word 0 is at_sp itself */
		u64 v = words[i];
		if (found < FINGERPRINT_RETURNS && v >= t->lo && v < t->hi) {
			h = (h ^ v) * 0x100000001b3ULL;
			found++;
		}
	}
	return h;
}

static __always_inline int wanted(u32 tgid)
{
#if TARGET_MODE == 1
	return targets.lookup(&tgid) != NULL;
#else
	return 1;
#endif
}

static __always_inline int enter(struct pt_regs *ctx, u64 size, u64 ptr_arg, u32 kind)
{
	u64 id = current_pid_tgid();
	u32 tgid = id >> 32;
	if (!armed() || !wanted(tgid))
		return 0;
	struct inflight *outer = inflight_map.lookup(&id);
	if (outer) {
		/* inside another allocator call of this thread (its own mmap, realloc(NULL) -> malloc):
		 * the outermost call accounts for the memory, once */
		outer->depth++;
		stats.increment(S_NESTED);
		return 0;
	}
	if (kind != K_REALLOC && kind != K_MREMAP && (size < MIN_SIZE || size > MAX_SIZE))
		return 0;
#if SAMPLE_EVERY > 1
	if (kind != K_REALLOC && kind != K_MREMAP && bpf_get_prandom_u32() % SAMPLE_EVERY) {
		stats.increment(S_SAMPLED_OUT);
		return 0;
	}
#endif
	int zero = 0;
	struct stack_sample *s = scratch.lookup(&zero);
	if (!s)
		return 0;
	uprobe_regs(&s->regs, ctx);
	struct inflight in = { .size = size, .ptr_arg = ptr_arg, .kind = kind, .depth = 1 };
	in.key.tgid = tgid;
	in.key.ip = s->regs.ip;
	bpf_probe_read_user(&in.key.at_sp, sizeof(in.key.at_sp), (void *)s->regs.sp);
	if (frame_pointer_usable(s, tgid)) {
		in.key.stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
		if (in.key.stack_id < 0)
			stats.increment(S_STACK_ERRORS);
	} else {
		in.key.stack_id = NO_FRAME_POINTERS; /* named from the stack copy by .eh_frame */
		in.key.at_sp ^= path_fingerprint(s, tgid);
	}
#if PY_FRAMES
	struct py_scratch *py = NULL;
	u64 py_hash = py_now(id, &py); /* one native stack serves many Python call paths */
	in.key.at_sp ^= py_hash;
#endif
	if (!samples.lookup(&in.key)) {
		copy_user_stack(s);
		if (samples.insert(&in.key, s) != 0)
			stats.increment(S_SAMPLES_DROPPED);
#if PY_FRAMES
		if (py_hash && py && pystacks.insert(&in.key, &py->st) != 0)
			stats.increment(S_PY_DROPPED);
#endif
	}
	inflight_map.update(&id, &in);
	return 0;
}

static __always_inline int leave(struct pt_regs *ctx)
{
	u64 id = current_pid_tgid();
	struct inflight *p = inflight_map.lookup(&id);
	if (!p)
		return 0;
	if (!armed()) {
		inflight_map.delete(&id);
		return 0;
	}
	if (p->depth > 1) {
		p->depth--; /* a nested call returning */
		return 0;
	}
	struct inflight in = *p;
	inflight_map.delete(&id);
	u64 ret = PT_REGS_RC(ctx), addr = ret;

	if (in.kind == K_MEMALIGN_PTR) {
		if (ret != 0) { /* posix_memalign returns an error number, the block via *memptr */
			stats.increment(S_FAILED);
			return 0;
		}
		bpf_probe_read_user(&addr, sizeof(addr), (void *)in.ptr_arg);
	}
	if (in.kind == K_MMAP || in.kind == K_MREMAP) {
		if (ret == (u64)-1) { /* MAP_FAILED */
			stats.increment(S_FAILED);
			return 0;
		}
	}
	if (in.kind == K_REALLOC || in.kind == K_MREMAP) {
		if (in.ptr_arg && (addr != 0 || in.size == 0))
			record_free(in.ptr_arg); /* moved (or freed by realloc(p, 0)): not duplicated */
		if (in.size < MIN_SIZE || in.size > MAX_SIZE)
			return 0;
	}
	if (addr == 0) {
		if (in.size != 0)
			stats.increment(S_FAILED); /* NULL: nothing is outstanding */
		return 0;
	}
	record_alloc(ctx, addr, in.size, &in.key);
	return 0;
}

/* n * size overflows 64 bits. Written without a 128-bit multiply, which BPF lacks; exact when
 * both fit in 32 bits, conservative beyond (such requests fail in any real allocator). */
static __always_inline int mul_overflows(u64 n, u64 size)
{
	if (!((n | size) >> 32))
		return 0;
	if ((n >> 32) && (size >> 32))
		return 1;
	u64 big = (n >> 32) ? n : size, small = (n >> 32) ? size : n;
	return ((big >> 32) * small) >> 32 != 0;
}

int malloc_enter(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM1(ctx), 0, K_MALLOC); }
int calloc_enter(struct pt_regs *ctx)
{
	u64 n = PT_REGS_PARM1(ctx), size = PT_REGS_PARM2(ctx);
	if (mul_overflows(n, size))
		return 0; /* calloc fails */
	return enter(ctx, n * size, 0, K_MALLOC);
}
int realloc_enter(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), K_REALLOC); }
int reallocarray_enter(struct pt_regs *ctx)
{
	u64 n = PT_REGS_PARM2(ctx), size = PT_REGS_PARM3(ctx);
	if (mul_overflows(n, size))
		return 0;
	return enter(ctx, n * size, PT_REGS_PARM1(ctx), K_REALLOC);
}
int posix_memalign_enter(struct pt_regs *ctx)
{
	return enter(ctx, PT_REGS_PARM3(ctx), PT_REGS_PARM1(ctx), K_MEMALIGN_PTR);
}
int aligned_alloc_enter(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM2(ctx), 0, K_MALLOC); }
int valloc_enter(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM1(ctx), 0, K_MALLOC); }
int mmap_enter(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM2(ctx), 0, K_MMAP); }
int mremap_enter(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM3(ctx), PT_REGS_PARM1(ctx), K_MREMAP); }
int alloc_return(struct pt_regs *ctx) { return leave(ctx); }

int free_enter(struct pt_regs *ctx)
{
	u64 addr = PT_REGS_PARM1(ctx);
	if (addr == 0 || !armed() || !wanted(current_pid_tgid() >> 32))
		return 0;
	if (!record_free(addr))
		stats.increment(S_UNKNOWN_FREES);
	return 0;
}

int munmap_enter(struct pt_regs *ctx)
{
	/* the allocator unmapping its own chunks is not a free of ours: no unknown-free count */
	if (armed() && wanted(current_pid_tgid() >> 32))
		record_free(PT_REGS_PARM1(ctx));
	return 0;
}

#else /* KERNEL_MODE */

static __always_inline int wanted_kernel(void)
{
#if TARGET_MODE == 1
	u32 tgid = current_pid_tgid() >> 32;
	return targets.lookup(&tgid) != NULL;
#else
	return 1;
#endif
}

static __always_inline void kalloc(void *ctx, u64 addr, u64 size)
{
	if (!armed() || !wanted_kernel() || size < MIN_SIZE || size > MAX_SIZE)
		return;
	struct stack_key key = { .tgid = current_pid_tgid() >> 32 };
	key.stack_id = stacks.get_stackid(ctx, 0);
	if (key.stack_id < 0)
		stats.increment(S_STACK_ERRORS);
	record_alloc(ctx, addr, size, &key);
}

/* pages are keyed apart from slab objects: pfn with the top bit set */
#define PAGE_KEY(pfn) ((pfn) | (1ULL << 63))

TRACEPOINT_PROBE(kmem, kmalloc) { kalloc(args, (u64)args->ptr, args->bytes_alloc); return 0; }
TRACEPOINT_PROBE(kmem, kmem_cache_alloc) { kalloc(args, (u64)args->ptr, args->bytes_alloc); return 0; }
TRACEPOINT_PROBE(kmem, kfree) { if (armed()) record_free((u64)args->ptr); return 0; }
TRACEPOINT_PROBE(kmem, kmem_cache_free) { if (armed()) record_free((u64)args->ptr); return 0; }
TRACEPOINT_PROBE(kmem, mm_page_alloc) { kalloc(args, PAGE_KEY(args->pfn), (u64)PAGE_BYTES << args->order); return 0; }
TRACEPOINT_PROBE(kmem, mm_page_free) { if (armed()) record_free(PAGE_KEY(args->pfn)); return 0; }

#endif
