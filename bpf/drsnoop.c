/* drsnoop: which tasks had to stop and reclaim memory inside their own allocation, how often and
 * for how long (direct reclaim, global and memcg). Aggregated per process in the kernel. */
#include "memdiag.h"

struct proc_key {
	u32 tgid;
	char comm[TASK_COMM_LEN];
};

struct reclaim_stats {
	u64 count;
	u64 total_ns;
	u64 max_ns;
	u64 pages;
	u64 memcg_count;
};

BPF_HASH(targets, u32, u8, 4096);
BPF_HASH(start, u32, u64, 10240); /* tid -> ns */
BPF_HASH(per_process, struct proc_key, struct reclaim_stats, 4096);
BPF_ARRAY(stats, u64, TABLE_ST_COUNT);

static __always_inline int wanted(void)
{
#if TARGET_MODE == 1
	u32 tgid = current_pid_tgid() >> 32;
	return targets.lookup(&tgid) != NULL;
#else
	return 1;
#endif
}

static __always_inline void begin(void)
{
	if (!wanted())
		return;
	u32 tid = current_pid_tgid();
	u64 now = bpf_ktime_get_ns();
	start.update(&tid, &now);
}

static __always_inline void end(u64 pages, int memcg)
{
	u32 tid = current_pid_tgid();
	u64 *ts = start.lookup(&tid);
	if (!ts)
		return;
	u64 delta = bpf_ktime_get_ns() - *ts;
	start.delete(&tid);
	struct proc_key key = { .tgid = current_pid_tgid() >> 32 };
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
	struct reclaim_stats zero = {};
	struct reclaim_stats *s = per_process.lookup_or_try_init(&key, &zero);
	if (!s) {
		stats.increment(TABLE_ST_TABLE_FULL);
		return;
	}
	__sync_fetch_and_add(&s->count, 1);
	__sync_fetch_and_add(&s->total_ns, delta);
	__sync_fetch_and_add(&s->pages, pages);
	if (memcg)
		__sync_fetch_and_add(&s->memcg_count, 1);
	if (delta > s->max_ns)
		s->max_ns = delta; /* a racy max is good enough for a report */
	stats.increment(TABLE_ST_EVENTS);
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_begin) { begin(); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_end) { end(args->nr_reclaimed, 0); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_begin) { begin(); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_end) { end(args->nr_reclaimed, 1); return 0; }
