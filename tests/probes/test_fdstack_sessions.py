"""fdstack names the code that leaves descriptors open, on the real kernel: a service leaks one
socket pair per failed handshake from handshake_fails() and closes every other one it opens."""

import os

from memdiag.diagnose.culprit import split_frame
from memdiag.probes import base, fdstack
from memdiag.system.target import Target


def _sockets(pid: int) -> int:
    """The socket descriptors the process has open now."""
    fds = f"/proc/{pid}/fd"
    return sum(1 for fd in os.listdir(fds) if os.readlink(f"{fds}/{fd}").startswith("socket:"))


def _functions(stack) -> list[str]:
    return [f for f in stack.functions if f]


def test_fdstack_names_the_function_that_leaves_socket_pairs_open(workload):
    w = workload("fdleak", "50", "5")  # 50 sessions a second, every 5th handshake fails: 20 descriptors/s leaked
    seen: list[int] = []
    hook = lambda _name: seen.append(_sockets(w.pid))  # noqa: E731  # counted once the probe is armed
    base.ATTACHED.append(hook)
    try:
        r = fdstack.run(Target.for_pid(w.pid), 4)
    finally:
        base.ATTACHED.remove(hook)
    leaked = _sockets(w.pid) - seen[0]  # the sockets left open while it watched (a session in flight: +-2)
    assert r.status == "ok", r.reason
    assert all(v == 0 for v in r.lost.values()), r.lost
    top = r.stacks[0]
    assert "handshake_fails" in _functions(top) and top.kind == "socketpair", top
    assert top.method == "eh_frame" and top.closed == 0
    assert leaked >= 40 and abs(top.outstanding - leaked) <= 4, (top.outstanding, leaked)
    served = next(s for s in r.stacks if "serve_session" in _functions(s))
    assert served.kind == "socketpair" and served.created >= 4 * leaked - 8
    assert served.outstanding <= 2 and served.closed >= served.created - 2  # closed as it goes
    churn = {s.kind: s for s in r.stacks if "notify_workers" in _functions(s)}
    assert set(churn) == {"pipe", "eventfd"} and all(s.outstanding <= 2 for s in churn.values())
    assert r.outstanding == sum(s.outstanding for s in r.stacks) and r.outstanding <= top.outstanding + 6
    facts = fdstack.facts_of(r, None, lambda frames, _fw: split_frame(next(f for f in frames if "libc" not in f))[0])
    assert (facts["fdstack.top_function"], facts["fdstack.top_type"]) == ("handshake_fails", "socketpair")
    assert facts["fdstack.top_outstanding"] == top.outstanding


def test_fdstack_counts_descriptors_closed_by_the_exit_as_closed_untraced(workload):
    w = workload("fdleak", "50", "5")
    import threading

    threading.Timer(3, w.stop).start()  # the process dies, and its descriptors with it
    r = fdstack.run(Target.for_pid(w.pid), 20)
    assert r.target_exited_at is not None
    assert r.outstanding == 0 and r.closed_untraced > 0
    assert any("closed untraced" in c for c in fdstack.caveats(r))
