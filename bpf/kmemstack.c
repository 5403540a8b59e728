/* kmemstack: the kernel's slab allocations made in the target's context that are still
 * outstanding, by kernel stack (the allocation site) and by the user stack of the target's code
 * whose system call (or fault) made them: memleak -K's answer, narrowed to the target and with the
 * code that asked for the memory.
 *
 * On the kmem tracepoints, which fire for every slab allocation and free on the host. Since 6.1
 * kmalloc_node and kmem_cache_alloc_node are gone (kmalloc and kmem_cache_alloc carry `node`);
 * since 6.2 kmem_cache_alloc and kmem_cache_free name the cache (`name`, a __data_loc string);
 * kmem_cache_alloc says `accounted` (charged to a memory cgroup), kmalloc only in its gfp_flags.
 * An allocation by a target (its tgid) records the object's address with its stack key and
 * bytes_alloc; a free of a recorded address, by any task (the kernel frees dentries from RCU
 * callbacks and reclaim, not in the caller's context), forgets it and moves its key's books.
 * What could not be recorded is counted in `stats`, never dropped silently.
 * Loader's defines: MAX_OBJS (outstanding objects kept), MAX_KEYS (stack keys).
 * Map lookups stay in this file: bcc rewrites them only in the main source. */
#include "memdiag.h"

#ifndef MAX_OBJS
#define MAX_OBJS 262144
#endif
#ifndef MAX_KEYS
#define MAX_KEYS 4096
#endif
/* __GFP_ACCOUNT (include/linux/gfp_types.h: bit 22 since 6.0; the tracepoint's format says so) */
#ifndef GFP_ACCOUNT_BIT
#define GFP_ACCOUNT_BIT 22
#endif

BPF_HASH(targets, u32, u8, 4096);
BPF_STACK_TRACE(stacks, MAX_KEYS); /* user and kernel stacks both */
BPF_F_TABLE("hash", struct kmem_key, struct kmem_books, counts, MAX_KEYS, BPF_F_NO_PREALLOC);
/* grows with use: a quiet target costs a few entries, a leaking one at most MAX_OBJS (~80 B each) */
BPF_F_TABLE("hash", u64, struct kmem_obj, objs, MAX_OBJS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct kmem_key, struct stack_sample, samples, 512, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(scratch, struct stack_sample, 1);
BPF_ARRAY(stats, u64, KMEM_ST_COUNT);
/* Armed once attached, disarmed before the tables are read: no allocation is recorded after the
 * books close, while frees of recorded objects still count until their program is detached. */
BPF_ARRAY(control, u32, 1);

static __always_inline int armed(void)
{
	int zero = 0;
	u32 *on = control.lookup(&zero);
	return on && *on;
}

/* The stack key of an allocation by the current task: its user registers (the task's own pt_regs,
 * saved at its entry into the kernel) and both stacks. */
static __always_inline struct stack_sample *stack_key(void *ctx, struct kmem_key *key)
{
	int zero = 0;
	struct stack_sample *s = scratch.lookup(&zero);
	if (!s)
		return NULL;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	read_user_regs(&s->regs, regs);
	key->ip = s->regs.ip;
	bpf_probe_read_user(&key->at_sp, sizeof(key->at_sp), (void *)s->regs.sp);
	key->stack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (key->stack_id < 0)
		stats.increment(KMEM_ST_STACK_ERRORS);
	key->kstack_id = stacks.get_stackid(ctx, 0);
	if (key->kstack_id < 0)
		stats.increment(KMEM_ST_KSTACK_ERRORS);
	return s;
}

/* The books of a key, made on its first allocation with the cache's name and a copy of the user
 * stack (for .eh_frame unwinding); NULL when the table of keys is full (counted). */
static __always_inline struct kmem_books *books_of(struct kmem_key *key, struct stack_sample *s, const char *cache,
						   u64 bytes)
{
	struct kmem_books *b = counts.lookup(key);
	if (b)
		return b;
	struct kmem_books fresh = { .size = bytes };
	if (cache)
		bpf_probe_read_kernel_str(fresh.cache, sizeof(fresh.cache), cache);
	if (counts.insert(key, &fresh) == 0) { /* ours: the key's first allocation */
		copy_user_stack(s);
		if (samples.insert(key, s) != 0)
			stats.increment(KMEM_ST_SAMPLES_DROPPED);
	}
	b = counts.lookup(key); /* another CPU's insert of the same key, or the table is full */
	if (!b)
		stats.increment(KMEM_ST_KEYS_DROPPED);
	return b;
}

static __always_inline void record_alloc(void *ctx, u64 ptr, u64 bytes, const char *cache, int accounted)
{
	if (!ptr)
		return;
	u32 tgid = current_pid_tgid() >> 32;
#if TARGET_MODE == 1
	if (!targets.lookup(&tgid))
		return;
#endif
	if (!armed())
		return;
	stats.increment(KMEM_ST_ALLOCS);
	struct kmem_key key = { .tgid = tgid };
	struct stack_sample *s = stack_key(ctx, &key);
	if (!s)
		return;
	struct kmem_books *b = books_of(&key, s, cache, bytes);
	if (!b)
		return;
	__sync_fetch_and_add(&b->allocs, 1);
	__sync_fetch_and_add(&b->alloc_bytes, bytes);
	if (accounted)
		__sync_fetch_and_add(&b->accounted, 1);
	struct kmem_obj o = { .key = key, .bytes = bytes, .ts = bpf_ktime_get_ns() };
	struct kmem_obj *old = objs.lookup(&ptr);
	if (old) { /* its free was missed (made before a program attached): the old one goes */
		struct kmem_key was = old->key;
		u64 was_bytes = old->bytes;
		struct kmem_books *wb = counts.lookup(&was);
		if (wb) {
			__sync_fetch_and_sub(&wb->outstanding_count, 1);
			__sync_fetch_and_sub(&wb->outstanding_bytes, was_bytes);
		}
		stats.increment(KMEM_ST_REUSED);
	}
	if (objs.update(&ptr, &o) != 0) {
		__sync_fetch_and_add(&b->untracked, 1);
		stats.increment(KMEM_ST_OBJS_DROPPED);
		return;
	}
	__sync_fetch_and_add(&b->outstanding_count, 1);
	__sync_fetch_and_add(&b->outstanding_bytes, bytes);
}

/* Every free on the host looks its address up: only the targets' objects are in the table. */
static __always_inline void record_free(u64 ptr)
{
	struct kmem_obj *o = objs.lookup(&ptr);
	if (!o)
		return;
	struct kmem_key key = o->key;
	u64 bytes = o->bytes;
	if (objs.delete(&ptr) != 0)
		return; /* another CPU's free of the same address took it first */
	stats.increment(KMEM_ST_FREES);
	struct kmem_books *b = counts.lookup(&key);
	if (!b)
		return;
	__sync_fetch_and_add(&b->frees, 1);
	__sync_fetch_and_add(&b->freed_bytes, bytes);
	__sync_fetch_and_sub(&b->outstanding_count, 1);
	__sync_fetch_and_sub(&b->outstanding_bytes, bytes);
}

TRACEPOINT_PROBE(kmem, kmem_cache_alloc)
{
#if CACHE_NAMES
	const char *cache = (const char *)args + (args->data_loc_name & 0xFFFF);
	record_alloc(args, (u64)args->ptr, args->bytes_alloc, cache, args->accounted);
#else
	/* a kernel before 6.2 names no cache here: the probe is unavailable there (kmemstack.requirements),
	 * and this program is only compiled, by `memdiag prepare`, never loaded */
	record_alloc(args, (u64)args->ptr, args->bytes_alloc, NULL, 0);
#endif
	return 0;
}

TRACEPOINT_PROBE(kmem, kmalloc)
{
	record_alloc(args, (u64)args->ptr, args->bytes_alloc, NULL, (args->gfp_flags >> GFP_ACCOUNT_BIT) & 1);
	return 0;
}

TRACEPOINT_PROBE(kmem, kmem_cache_free)
{
	record_free((u64)args->ptr);
	return 0;
}

TRACEPOINT_PROBE(kmem, kfree)
{
	record_free((u64)args->ptr);
	return 0;
}
