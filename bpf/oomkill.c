/* oomkill: every OOM kill, with the victim and the task that triggered it.
 *
 * oom:mark_victim fires in the context of the task whose allocation invoked the OOM killer (the
 * trigger), with the victim's pid in its fields: the stacks taken here are the trigger's, never
 * the victim's. Kernels since 6.2 also carry the victim's RSS split (HAVE_VICTIM_RSS, set by the
 * loader from the tracepoint's format file).
 *
 * In a pid namespace of memdiag's own the tracepoint's pid is the host's, a number memdiag's /proc
 * does not show: the trigger is `current` (current_pid_tgid gives it in memdiag's namespace), and
 * a raw tracepoint on the same event, which receives the victim's task_struct (kernels whose
 * tracepoint has a uid field), records the victim's pid in memdiag's namespace in victim_ns (0:
 * the victim is not in it), and in any namespace the victim's number in its own innermost pid
 * namespace (what a container's ps shows). Struct offsets come from the kernel's BTF (probes/btf.py), not from
 * the headers bcc compiles against. */
#include "memdiag.h"

struct oom_event {
	u64 ts_ns;
	u32 victim_host_pid; /* the tracepoint's pid: the initial namespace's number */
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
BPF_ARRAY(stats, u64, OOM_ST_COUNT);

#if defined(TASK_THREAD_PID)
/* The victim's pid in memdiag's namespace (0: not in it; only computed when memdiag runs in a
 * namespace of its own) and in its own innermost namespace (a container's number for it). */
struct victim_pids {
	u32 ns_nr;
	u32 inner_nr;
};
/* the victim's host pid (what the tracepoint and the kernel log give) -> its other numbers; read
 * and deleted by the loader (LRU: an entry whose event was lost never fills the map) */
BPF_TABLE("lru_hash", u32, struct victim_pids, victim_ns, 256);

/* How deep pid namespaces nest (MAX_PID_NS_LEVEL, include/linux/pid_namespace.h). */
#define MAX_PID_NS_LEVEL 32

RAW_TRACEPOINT_PROBE(mark_victim)
{
	void *task = (void *)ctx->args[0]; /* TP_PROTO(struct task_struct *task, uid_t uid) */
	void *pid = NULL;
	u32 host = 0, level = 0;
	struct victim_pids v = {};
	bpf_probe_read_kernel(&host, sizeof(host), task + TASK_PID);
	bpf_probe_read_kernel(&pid, sizeof(pid), task + TASK_THREAD_PID);
	if (pid == NULL)
		return 0;
	bpf_probe_read_kernel(&level, sizeof(level), pid + PID_LEVEL);
	if (level <= MAX_PID_NS_LEVEL) /* the number its own namespace gives it: numbers[level] */
		bpf_probe_read_kernel(&v.inner_nr, sizeof(v.inner_nr), pid + PID_NUMBERS + level * UPID_SIZE + UPID_NR);
#ifdef PIDNS_INO
	/* pid_nr_ns(): the task's number at each level, up to its own; memdiag's is the one whose
	 * namespace has memdiag's inode */
#pragma unroll
	for (int i = 0; i <= MAX_PID_NS_LEVEL; i++) {
		if (i > level)
			break;
		void *upid = pid + PID_NUMBERS + i * UPID_SIZE;
		void *ns = NULL;
		u32 inum = 0;
		bpf_probe_read_kernel(&ns, sizeof(ns), upid + UPID_NS);
		if (ns == NULL)
			break;
		bpf_probe_read_kernel(&inum, sizeof(inum), ns + PIDNS_INUM);
		if (inum == (u32)PIDNS_INO) {
			bpf_probe_read_kernel(&v.ns_nr, sizeof(v.ns_nr), upid + UPID_NR);
			break;
		}
	}
#endif
	victim_ns.update(&host, &v);
	return 0;
}
#endif

TRACEPOINT_PROBE(oom, mark_victim)
{
	struct oom_event e = {};
	u64 id = current_pid_tgid(); /* 0 when the trigger is outside memdiag's pid namespace */
	e.ts_ns = bpf_ktime_get_ns();
	e.victim_host_pid = args->pid;
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
		stats.increment(OOM_ST_STACK_ERRORS);
	stats.increment(OOM_ST_EVENTS);
	events.perf_submit(args, &e, sizeof(e));
	return 0;
}
