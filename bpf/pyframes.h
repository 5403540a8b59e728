/* The current thread's CPython frames, walked at the event (an allocation, a page fault, an
 * mmap): they are gone by the time user space could look. The walk touches no map (bcc rewrites
 * map calls only in the main file): the maps and py_now(), which hands their entries in, are
 * pynow.h's, pasted into each program's text by probes/compiler.py. Layout (struct py_proc) and records (struct py_stack) are in
 * memdiag.h; probes/cpython/ fills the one and reads the other.
 *
 * From the thread state of the current thread (found by its native_thread_id in the
 * interpreter's list, not as the GIL's holder: a thread calling C through ctypes has released
 * the GIL and still has its frames), the innermost _PyInterpreterFrame, then each `previous`:
 * each frame's code object pointer, instruction pointer and globals dict, nothing else. User
 * space checks that the code pointer is a code object (its type is PyCode_Type) before it reads
 * a name, and that the globals are a dict before it reads them, so a torn or reused frame gives
 * no frame, never a wrong one. */
#ifndef PYFRAMES_H
#define PYFRAMES_H

#include "memdiag.h"

/* Bytes of a frame read at once: every field walked lies below (owner: 69 in 3.11, 70 in 3.12
 * and 3.13; layout.py checks each layout against it). */
#define PY_FRAME_READ 72
#define PY_FIELD_MASK 0x7f
/* The read, with room for any masked offset plus the 8 bytes loaded there (the verifier's bound). */
#define PY_FRAME_BUF (PY_FIELD_MASK + 1 + 8)
/* A thread found without a thread state (a thread that never ran Python) is looked for again
 * after this long, not on every event. */
#define PY_RELOOK_NS 1000000000ULL
#define PY_SHIM_STEPS 8 /* shim frames (3.12+) the walk may step over beyond PY_MAX_FRAMES */
#define PY_FNV_OFFSET 0xcbf29ce484222325ULL
#define PY_FNV_PRIME 0x100000001b3ULL

struct py_scratch {
	struct py_stack st;
	u8 frame[PY_FRAME_BUF];
};

static __always_inline u64 py_read_u64(u64 addr)
{
	u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0)
		return 0;
	return v;
}

static __always_inline u64 py_buf_u64(const u8 *buf, u16 off)
{
	return *(const u64 *)(buf + (off & PY_FIELD_MASK));
}

/* The thread state whose native_thread_id is tid: in the interpreter's list of thread states
 * (new threads are pushed at its head), at most PY_MAX_THREADS looked at; 0 where none is. */
static __always_inline u64 py_find_tstate(const struct py_proc *p, u32 tid)
{
	u64 interp = py_read_u64(p->interp_head);
	if (!interp)
		return 0;
	u64 ts = py_read_u64(interp + p->interp_threads);
#pragma clang loop unroll(disable)
	for (int i = 0; i < PY_MAX_THREADS && ts; i++) {
		if (py_read_u64(ts + p->tstate_tid) == tid)
			return ts;
		ts = py_read_u64(ts + p->tstate_next);
	}
	return 0;
}

/* The thread state of thread tid. cached: what the probe's py_threads map held for it (NULL:
 * nothing); a thread state is trusted only while it still holds the native id it was found with
 * (a freed one may be reused). *fresh gets what the map should hold now, looked_ns 0 when it need
 * not change. A thread not in the map is looked for by tid: the id in the target's namespace is
 * tid unless the target has a pid namespace of its own (user space fills the map for those). */
static __always_inline u64 py_tstate(const struct py_proc *p, u32 tid, const struct py_thread *cached,
				     struct py_thread *fresh)
{
	fresh->tstate = 0;
	fresh->looked_ns = 0;
	fresh->native_tid = tid;
	if (cached && cached->tstate && py_read_u64(cached->tstate + p->tstate_tid) == cached->native_tid)
		return cached->tstate;
	u64 now = bpf_ktime_get_ns();
	if (cached && !cached->tstate && now - cached->looked_ns < PY_RELOOK_NS)
		return 0;
	fresh->tstate = py_find_tstate(p, tid);
	fresh->looked_ns = now;
	return fresh->tstate;
}

/* The frames from thread state ts into s->st, innermost first; returns a hash of them (code
 * and instruction pointers) for the probe's stack key, 0 where there is no frame. */
static __always_inline u64 py_walk(const struct py_proc *p, u64 ts, struct py_scratch *s)
{
	struct py_stack *st = &s->st;
	st->depth = 0;
	st->flags = 0;
	u64 frame = py_read_u64(ts + p->tstate_frame);
	if (p->cframe_frame != PY_NO_FIELD && frame)
		frame = py_read_u64(frame + p->cframe_frame);
	u64 h = PY_FNV_OFFSET;
	/* The depth lives in the map value, not in a register: the verifier then does not follow
	 * every (step, depth) pair through the rest of the probe (1M instructions and refused). */
#pragma clang loop unroll(disable)
	for (int i = 0; i < PY_MAX_FRAMES + PY_SHIM_STEPS && frame; i++) {
		if (bpf_probe_read_user(s->frame, PY_FRAME_READ, (void *)frame) != 0) {
			st->flags |= PY_READ_FAILED;
			break;
		}
		u64 code = py_buf_u64(s->frame, p->frame_code);
		u64 instr = py_buf_u64(s->frame, p->frame_instr);
		frame = py_buf_u64(s->frame, p->frame_previous);
		u8 owner = s->frame[p->frame_owner & PY_FIELD_MASK];
		u32 depth = st->depth;
		if (p->owner_cstack != PY_NO_OWNER && owner == p->owner_cstack) {
			/* a shim pushed where C called into the interpreter: the frame before it ends its call */
			if (depth > 0)
				st->frames[(depth - 1) & (PY_MAX_FRAMES - 1)].instr |= PY_LAST_IN_CALL;
			continue;
		}
		if (depth >= PY_MAX_FRAMES) {
			st->flags |= PY_TRUNCATED;
			break;
		}
		if (p->frame_entry != PY_NO_FIELD && s->frame[p->frame_entry & PY_FIELD_MASK])
			instr |= PY_LAST_IN_CALL;
		st->frames[depth & (PY_MAX_FRAMES - 1)].code = code;
		st->frames[depth & (PY_MAX_FRAMES - 1)].instr = instr;
		st->frames[depth & (PY_MAX_FRAMES - 1)].globals = py_buf_u64(s->frame, p->frame_globals);
		st->depth = depth + 1;
		h = (h ^ code) * PY_FNV_PRIME;
		h = (h ^ instr) * PY_FNV_PRIME;
	}
	return st->depth ? h : 0;
}

#endif
