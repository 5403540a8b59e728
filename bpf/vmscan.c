/* vmscan: page reclaim as latency, from the vmscan tracepoints.
 * Latency histograms (log2 microseconds) for direct reclaim, memcg reclaim and slab shrinking,
 * the pages each reclaimed, and kswapd wake-ups with the time it stayed awake. Per-thread start
 * times are keyed by thread id, so concurrent reclaimers never collide. */
#include "memdiag.h"

enum kind { DIRECT = 0, MEMCG = 1, SLAB = 2, KSWAPD = 3, KINDS = 4 };

struct hist_key {
	u32 kind;
	u32 slot;
};

BPF_HASH(start, u64, u64, 10240); /* (kind << 32 | tid) -> ns */
BPF_HASH(hist, struct hist_key, u64, 256);
BPF_ARRAY(totals_ns, u64, KINDS);
BPF_ARRAY(events, u64, KINDS);
BPF_ARRAY(reclaimed, u64, KINDS);
BPF_ARRAY(kswapd_wakes, u64, 1);

static __always_inline u64 tkey(u32 kind)
{
	return ((u64)kind << 32) | (u32)current_pid_tgid();
}

static __always_inline void begin(u32 kind)
{
	u64 k = tkey(kind), now = bpf_ktime_get_ns();
	start.update(&k, &now);
}

static __always_inline void end(u32 kind, u64 pages)
{
	u64 k = tkey(kind);
	u64 *ts = start.lookup(&k);
	if (!ts)
		return; /* began before we attached */
	u64 delta = bpf_ktime_get_ns() - *ts;
	start.delete(&k);
	struct hist_key hk = { .kind = kind, .slot = bpf_log2l(delta / 1000 + 1) };
	hist.increment(hk);
	int i = kind;
	u64 *t = totals_ns.lookup(&i);
	if (t)
		__sync_fetch_and_add(t, delta);
	u64 *r = reclaimed.lookup(&i);
	if (r)
		__sync_fetch_and_add(r, pages);
	events.increment(i);
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_begin) { begin(DIRECT); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_end) { end(DIRECT, args->nr_reclaimed); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_begin) { begin(MEMCG); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_end) { end(MEMCG, args->nr_reclaimed); return 0; }
TRACEPOINT_PROBE(vmscan, mm_shrink_slab_start) { begin(SLAB); return 0; }
TRACEPOINT_PROBE(vmscan, mm_shrink_slab_end) { end(SLAB, args->retval > 0 ? args->retval : 0); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_kswapd_wake) { kswapd_wakes.increment(0); begin(KSWAPD); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_kswapd_sleep) { end(KSWAPD, 0); return 0; }
