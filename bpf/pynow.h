/* pynow.h: the maps and the entry point every program that records Python stacks shares
 * (faults, mmapsnoop, memleak), around the walk in pyframes.h. Not for the preprocessor: bcc
 * rewrites map calls (py_procs.lookup) in the main file only, so probes/compiler.py pastes this
 * file's text in place of the program's `#include "pynow.h"` line before bcc compiles it. Each
 * program keeps its own pystacks map, whose key is its own stack key. */

/* the layout of each CPython target (filled by probes/cpython/frames.py) */
BPF_HASH(py_procs, u32, struct py_proc, 1024);
/* each thread's thread state, as last found (py_tstate) */
BPF_F_TABLE("lru_hash", u32, struct py_thread, py_threads, 8192, 0);
BPF_PERCPU_ARRAY(py_scratch, struct py_scratch, 1);

/* The hash of the calling thread's Python stack (0: not a CPython thread), its frames in *out. */
static __always_inline u64 py_now(u64 id, struct py_scratch **out)
{
	u32 tgid = id >> 32, tid = (u32)id;
	int zero = 0;
	struct py_proc *p = py_procs.lookup(&tgid);
	struct py_scratch *s = py_scratch.lookup(&zero);
	if (!p || !s)
		return 0;
	struct py_thread fresh;
	u64 ts = py_tstate(p, tid, py_threads.lookup(&tid), &fresh);
	if (fresh.looked_ns)
		py_threads.update(&tid, &fresh);
	*out = s;
	return ts ? py_walk(p, ts, s) : 0;
}
