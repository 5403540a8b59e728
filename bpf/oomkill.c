/* oomkill: every OOM kill, with the victim and the task that triggered it.
 *
 * oom:mark_victim fires in the context of the task whose allocation invoked the OOM killer (the
 * trigger), with the victim's pid in its fields: the stacks taken here are the trigger's, never
 * the victim's. Kernels since 6.2 also carry the victim's RSS split (HAVE_VICTIM_RSS, set by the
 * loader from the tracepoint's format file). */
#include "memdiag.h"

struct oom_event {
	u64 ts_ns;
	u32 victim_pid;
	u32 trigger_pid;
	u32 trigger_tid;
	s32 user_stack_id;
	s32 kernel_stack_id;
	s32 oom_score_adj;
	u64 total_vm;
	u64 anon_rss;
	u64 file_rss;
	u64 shmem_rss;
	char trigger_comm[TASK_COMM_LEN];
	char victim_comm[TASK_COMM_LEN];
};

BPF_PERF_OUTPUT(events);
BPF_STACK_TRACE(stacks, 1024);
BPF_ARRAY(stats, u64, 2); /* 0 events, 1 stack errors */

TRACEPOINT_PROBE(oom, mark_victim)
{
	struct oom_event e = {};
	u64 id = bpf_get_current_pid_tgid();
	e.ts_ns = bpf_ktime_get_ns();
	e.victim_pid = args->pid;
	e.trigger_pid = id >> 32;
	e.trigger_tid = (u32)id;
	bpf_get_current_comm(&e.trigger_comm, sizeof(e.trigger_comm));
#ifdef HAVE_VICTIM_COMM
	TP_DATA_LOC_READ_CONST(&e.victim_comm, comm, TASK_COMM_LEN);
#endif
#ifdef HAVE_VICTIM_RSS
	e.total_vm = args->total_vm;
	e.anon_rss = args->anon_rss;
	e.file_rss = args->file_rss;
	e.shmem_rss = args->shmem_rss;
	e.oom_score_adj = args->oom_score_adj;
#endif
	e.user_stack_id = stacks.get_stackid(args, BPF_F_USER_STACK);
	e.kernel_stack_id = stacks.get_stackid(args, 0);
	if (e.user_stack_id < 0 && e.kernel_stack_id < 0)
		stats.increment(1);
	stats.increment(0);
	events.perf_submit(args, &e, sizeof(e));
	return 0;
}
