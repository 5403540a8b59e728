/* swapin: swap-ins attributed by process and the address ranges touched; swapon/swapoff calls.
 *
 * Where kprobes exist (USE_KPROBE), the loader attaches count_swap_read to the kernel's swap
 * read function as bcc's swapin does. Where they do not, major page faults (a perf software
 * event, with the faulting address) stand in: user space keeps those on anonymous memory, which
 * can only be satisfied from swap, and tells file-backed ones (page-cache misses) apart. */
#include "memdiag.h"

/* On x86-64 the perf event context (uapi/linux/bpf_perf_event.h: the user registers, then
 * sample_period and addr) is declared here: that header pulls in much of the kernel's headers
 * through asm/bpf_perf_event.h, 40 MiB more of bcc's compiler and 2.5 s (measured on 6.18). */
#ifdef __x86_64__
struct perf_event_ctx {
	struct pt_regs regs;
	u64 sample_period;
	u64 addr;
};
#else
#include <uapi/linux/bpf_perf_event.h>
#define perf_event_ctx bpf_perf_event_data
#endif

#ifndef REGION_SHIFT
#define REGION_SHIFT 21 /* 2 MiB regions */
#endif

struct fault_key {
	u32 tgid;
	u32 pad;
	u64 region;
	char comm[TASK_COMM_LEN];
};

struct swap_call {
	u32 pid;
	u32 on; /* 1 swapon, 0 swapoff */
	char comm[TASK_COMM_LEN];
	char path[128];
};

BPF_HASH(targets, u32, u8, 4096);
BPF_HASH(faults, struct fault_key, u64, 10240);
BPF_HASH(swap_reads, u32, u64, 4096); /* tgid -> kernel swap reads (kprobe method) */
BPF_PERF_OUTPUT(swap_calls);
BPF_ARRAY(stats, u64, TABLE_ST_COUNT);

static __always_inline int wanted(u32 tgid)
{
#if TARGET_MODE == 1
	return targets.lookup(&tgid) != NULL;
#else
	return 1;
#endif
}

int on_major_fault(struct perf_event_ctx *ctx)
{
	u32 tgid = current_pid_tgid() >> 32;
	if (!wanted(tgid))
		return 0;
	struct fault_key key = { .tgid = tgid, .region = ctx->addr >> REGION_SHIFT };
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
	u64 zero = 0, *n = faults.lookup_or_try_init(&key, &zero);
	if (!n) {
		stats.increment(TABLE_ST_TABLE_FULL);
		return 0;
	}
	__sync_fetch_and_add(n, 1);
	stats.increment(TABLE_ST_EVENTS);
	return 0;
}

#ifdef USE_KPROBE
int count_swap_read(struct pt_regs *ctx)
{
	u32 tgid = current_pid_tgid() >> 32;
	if (!wanted(tgid))
		return 0;
	u64 zero = 0, *n = swap_reads.lookup_or_try_init(&tgid, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}
#endif

static __always_inline void swap_call(void *ctx, const char *path, u32 on)
{
	struct swap_call c = { .pid = current_pid_tgid() >> 32, .on = on };
	bpf_get_current_comm(&c.comm, sizeof(c.comm));
	bpf_probe_read_user_str(&c.path, sizeof(c.path), path);
	swap_calls.perf_submit(ctx, &c, sizeof(c));
}

TRACEPOINT_PROBE(syscalls, sys_enter_swapon) { swap_call(args, args->specialfile, 1); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_swapoff) { swap_call(args, args->specialfile, 0); return 0; }
