"""Source lines looked up in a process of memdiag's own, under a memory and a time limit.

The DWARF a line is read from is the target's (its binary, or a debug file its build id or
debuglink names): probes/lines.py bounds the bytes it reads and decodes, but not what pyelftools
builds of them (objects per range list, per line-program header, per entry) nor the time that
takes. So memdiag itself decodes no DWARF: the report's lines are asked of a child process
(`python -m memdiag.probes.linechild`), one per set of stacks, with an address-space limit and a
deadline. A module whose lookup fails there (its DWARF raised, ran the child out of memory, or
out of time) has no lines, is said so once in the module's notes, and is not tried again by this
memdiag; the modules after it are asked of a new child while the deadline lasts.

The protocol: one JSON request on the child's standard input, {"modules": [{"path", "module",
"ident": [dev, ino], "addresses": [...]}, ...]}; the child answers one JSON line per module, in
order, as soon as it has it: {"lines": [[file, line] | null, ...], "note": str | null}."""

from __future__ import annotations

import json
import os
import resource
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass

from memdiag.system.signals import interrupted

CHILD_MEMORY = 768 << 20  # the child's address space: Python, pyelftools, sections held (lines.MAX_HELD_BYTES)
DEADLINE_S = 20.0  # for all the lookups of one set of stacks, children started again included
MAX_ANSWER = 1 << 20  # bytes of one answer line (a module's lines: file names cut at lines.MAX_FILE_NAME)
MAX_ADDRESSES = 4096  # addresses of one module asked at once (the frames of the stacks a report shows)


@dataclass(frozen=True)
class Request:
    path: str  # the file on this host (AddressSpace.file_path), opened by the child as it is
    module: str  # the module's path as the process maps it (a debuglink is looked for beside it)
    ident: tuple[int, int]  # (device, inode) the file must still be
    addresses: tuple[int, ...]  # ELF virtual addresses


@dataclass(frozen=True)
class Answer:
    lines: tuple[tuple[str, int] | None, ...] | None  # None: the module failed (see note)
    note: str | None = None


# modules whose lookup failed in a child (by identity): not tried again in this process
_FAILED: dict[tuple[int, int], str] = {}


def lookup(requests: list[Request], deadline_s: float = DEADLINE_S, memory: int = CHILD_MEMORY) -> list[Answer]:
    """Each request's lines, in order, from child processes under `memory` bytes of address space
    and `deadline_s` seconds for them all."""
    out: list[Answer | None] = [None] * len(requests)
    todo = []
    for i, r in enumerate(requests):
        if r.ident in _FAILED:
            out[i] = Answer(None, None)  # said once already, when it failed
        else:
            todo.append(i)
    end = time.monotonic() + deadline_s
    if interrupted():  # a stop under way: no child started for lines
        for i in todo:
            out[i] = Answer(None, f"no source lines ({INTERRUPTED})")
        todo = []
    while todo:
        left = end - time.monotonic()
        if left <= 0:
            for i in todo:
                why = f"memdiag's {deadline_s:g} s for looking lines up ran out before it"
                out[i] = Answer(None, f"no source lines ({why})")
            break
        got, why, spent = _child([requests[i] for i in todo], left, memory)
        for i, answer in zip(todo, got, strict=False):
            out[i] = answer
        if len(got) == len(todo):
            break
        if why == INTERRUPTED:  # nothing failed: the rest are not asked
            for i in todo[len(got) :]:
                out[i] = Answer(None, f"no source lines ({why})")
            break
        failed = todo[len(got)]  # the module the child was reading when it ended
        out[failed] = Answer(None, f"no source lines ({why})")
        # not read again by this memdiag: a module that broke its reader, or had at least half of the
        # time for itself (one the time ran out on after others took it is only not read this time)
        if why != TIMED_OUT or spent >= deadline_s / 2:
            _FAILED[requests[failed].ident] = why
        todo = todo[len(got) + 1 :]
    return [a if a is not None else Answer(None) for a in out]


TIMED_OUT = "its DWARF took more than memdiag's time for looking lines up"
INTERRUPTED = "memdiag was interrupted before they were looked up"
TICK_S = 0.05  # how often the wait for the child's answers looks for a signal (as every wait of memdiag's does)


def _child(requests: list[Request], timeout: float, memory: int) -> tuple[list[Answer], str, float]:
    """The answers one child gave before it ended, why it ended early (when it did), and the
    seconds it spent on the module it did not answer."""
    body = json.dumps(
        {
            "modules": [
                {"path": r.path, "module": r.module, "ident": list(r.ident), "addresses": list(r.addresses)}
                for r in requests
            ]
        }
    ).encode()
    # -I: no PYTHON* variable, user site or current folder of the operator's: memdiag as installed
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-m", "memdiag.probes.linechild", str(memory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        close_fds=True,
    )
    answers: list[Answer] = []
    why = "its reader ended"
    since = time.monotonic()  # when the module being read began: the child's start, then each answer
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(body)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        end = time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while len(answers) < len(requests):
                left = end - time.monotonic()
                if left <= 0:
                    why = TIMED_OUT
                    break
                if interrupted():  # asked every tick: a SIGTERM's stop is not held up by lines (CI, under load)
                    why = INTERRUPTED
                    break
                if not sel.select(min(left, TICK_S)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    code = proc.wait()
                    why = _ended(code)
                    break
                buf += chunk
                while b"\n" in buf and len(answers) < len(requests):
                    line, buf = buf.split(b"\n", 1)
                    answers.append(_answer(line, requests[len(answers)]))
                    since = time.monotonic()
                if len(buf) > MAX_ANSWER:
                    why = "its reader's answer was over memdiag's bound"
                    break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    return answers, why, time.monotonic() - since


def _ended(code: int) -> str:
    if code < 0:
        return f"its reader was ended by signal {-code} (over memdiag's memory bound or killed)"
    return f"its reader ended with status {code}"


def _answer(line: bytes, request: Request) -> Answer:
    try:
        raw = json.loads(line)
        lines = tuple((str(x[0]), int(x[1])) if isinstance(x, list) and len(x) == 2 else None for x in raw["lines"])
        note = raw.get("note")
    except (ValueError, KeyError, TypeError, IndexError):
        return Answer(None, "no source lines (its reader's answer could not be read)")
    if len(lines) != len(request.addresses):
        return Answer(None, "no source lines (its reader's answer did not match the question)")
    return Answer(lines, str(note) if note else None)


# --- the child ---------------------------------------------------------------------------------


def _limit(memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _serve(request: dict) -> None:
    from .elf import NOTES, passing_elf_info

    for m in request["modules"]:
        addresses = [int(a) for a in m["addresses"]][:MAX_ADDRESSES]
        found: list = [None] * len(m["addresses"])
        note = None
        elf = None
        try:
            elf = passing_elf_info(str(m["path"]), (int(m["ident"][0]), int(m["ident"][1])))
            table = elf.lines(str(m["module"])) if elf is not None else None
            if table is not None:
                for k, a in enumerate(addresses):
                    at = table.source(a)
                    found[k] = [at[0], at[1]] if at else None
                note = f"source lines: {table.note}" if table.note else None
        except MemoryError:
            note = "no source lines (its DWARF needs more than memdiag's memory bound for reading it)"
        except Exception as e:  # noqa: BLE001  (a hostile file's DWARF raises anything: no line, noted)
            note = f"no source lines ({type(e).__name__})"
        finally:
            if elf is not None:
                elf.close()
        if note is None and elf is not None and elf.path in NOTES:
            note = NOTES[elf.path]
        sys.stdout.write(json.dumps({"lines": found, "note": note}) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    _limit(int(argv[1]))
    request = json.loads(sys.stdin.buffer.read())
    _serve(request)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
