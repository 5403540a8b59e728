"""Which frame of a stack names the culprit: the first one (from the leaf) a user should read.

Allocator entry points, allocation wrappers (xmalloc, zmalloc, g_malloc, operator new, PyMem_Malloc
...) and runtime code (libc, libstdc++, std:: templates) are passed over, by the playbook's
`wrappers:` list (data, extendable by a site's files) and, for wrappers nobody listed, by what the
probe read in the function's code (it only forwards what an allocator returned: a guess, said so).
Interpreter frames are named, since no native frame is closer to the program, and marked as such;
where the stack carries frames of the program's own language that a runtime's probe read (a
Python frame `handle_order (/srv/orders.py:42) [python]`: the runtime's face says how they look,
probes/runtime.py Frames), the interpreter's frames are passed over and that frame is named, and a
native culprit (a C library called through ctypes) is named with its caller in that language.
The whole stack stays in the report; each frame gets its kind."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from memdiag.probes.registry import REGISTRY
from memdiag.probes.runtime import Frames
from memdiag.rules.loader import load_playbook, shipped_playbooks
from memdiag.rules.model import FrameClass

# `fn+0x1a [module]`, with details where known: `fn+0x1a (GCC clone .isra.0) [module]`, a frame with its
# file:line `fn (orderd.c:16, GCC clone .isra.0) [module]`, a Go frame `main.handle (main.go:30, inlined) [orderd]`
_FRAME = re.compile(
    r"^(?P<fn>.*?)(?:\+0x[0-9a-f]+(?: \((?P<more>[^()]*)\))?| \((?P<detail>[^()]*)\)) \[(?P<mod>[^\]]+)\]$"
)
_SOURCE = re.compile(r"^\S+:\d+$")  # a detail that is a file:line
_CLONE_DETAIL = re.compile(r"^(?:GCC|LLVM) clone (?P<clone>\S+)$")
_UNKNOWN = re.compile(r"^\[unknown\](?: \[(?P<mod>.+)\])?$")  # the module may be bracketed itself: [[anon]]
PASSED_OVER = ("allocator", "wrapper", "guessed-wrapper", "runtime")
JIT_UNNAMED = "unnamed JIT-compiled code (no perf map)"
JIT_INTERPRETED = "a method the JVM's interpreter ran (not compiled yet: its perf map names no such method)"


@dataclass(frozen=True)
class Named:
    """A stack read for its culprit: a kind per frame (allocator, wrapper, guessed-wrapper, runtime,
    unknown: passed over; culprit or interpreter: the one named; caller: above it), the culprit's
    index and name."""

    kinds: list[str]
    index: int | None
    function: str | None
    guessed: bool  # a frame was passed over as a wrapper from its code alone, not from the list
    interpreter: bool  # the culprit is an interpreter function
    label: str | None = None  # the function, or the module of an unnamed one: what facts say
    python_caller: str | None = None  # a native culprit's first Python frame above it (ctypes)
    source: str | None = None  # the culprit frame's file:line, where its frame says it
    clone: str | None = None  # the compiler's clone suffix of the culprit's symbol (".isra.0")


@functools.lru_cache(maxsize=1)
def languages() -> tuple[Frames, ...]:
    """How each runtime's probes print frames of the program's own language (their faces')."""
    return tuple(face.frames for face in REGISTRY.runtime_faces() if face.frames is not None)


def language_of(module: str | None) -> Frames | None:
    """The language whose frames carry this module name ("python"), or None (a native module)."""
    return next((lang for lang in languages() if module in lang.modules), None)


@functools.lru_cache(maxsize=1)
def shipped_wrappers() -> tuple[FrameClass, ...]:
    return tuple(load_playbook(shipped_playbooks()).wrappers)


@functools.lru_cache(maxsize=1)
def default_classes() -> Classes:
    """The shipped list alone (a diagnosis passes its playbook's, site files included)."""
    return Classes(shipped_wrappers())


def _bare(name: str) -> str:
    """A C++ name without its arguments and the return type a template function's name carries:
    `void std::vector<int>::_M_realloc_insert<int>(...)` -> `std::vector<int>::_M_realloc_insert<int>`."""
    head = name.split("(", 1)[0]
    depth, cut = 0, 0
    for i, c in enumerate(head):
        depth += (c == "<") - (c == ">")
        if c == " " and depth == 0 and not head[:i].endswith("operator"):
            cut = i + 1
    return head[cut:]


def _glob(pattern: str, text: str) -> bool:
    return pattern == text or fnmatchcase(text, pattern)


class Classes:
    """The wrappers list, matched against frames (function entries win over module entries)."""

    def __init__(self, entries: tuple[FrameClass, ...] | list[FrameClass]):
        self.by_function = [e for e in entries if e.function]
        self.by_module = [e for e in entries if not e.function]

    @functools.lru_cache(maxsize=8192)  # noqa: B019  (one Classes per playbook, kept for the run)
    def kind(self, function: str | None, module: str | None) -> str | None:
        mod = (module or "").rsplit("/", 1)[-1]
        language = language_of(mod) is not None
        if function:
            bare = _bare(function)
            for e in self.by_function:
                if language and e.module is None:
                    continue  # a C name's glob (malloc, xmalloc*) says nothing of a Python function
                if (_glob(e.function, function) or _glob(e.function, bare)) and (
                    e.module is None or _glob(e.module, mod)
                ):
                    return e.kind
        for e in self.by_module:
            if _glob(e.module, mod):
                return e.kind
        return None

    def name(self, frames: list[str], forwards: list[bool] | None = None) -> Named:
        """Kinds for each frame and the culprit: the first frame from the leaf that is not passed
        over. forwards[i]: the probe read frame i's code as only forwarding an allocation; it is
        passed over as a wrapper when every frame below it was passed over too."""
        kinds: list[str] = []
        index, guessed = None, False
        split = [split_frame(f) for f in frames]
        # the program's own frames above: its language's (Python's, read by a runtime's probe), or
        # code a JIT compiled for it that is not the runtime's own (a JVM's perf map names
        # Thumbnails.thumbnail(int) above libjvm.so's os::malloc; the JDK's classes are passed over)
        own = [language_of(m) is not None or (fn is not None and _jit(m) and self.kind(fn, m) not in PASSED_OVER)
               for fn, m in split]  # fmt: skip
        read_above = [any(own[i + 1 :]) for i in range(len(split))]
        for i, (fn, mod) in enumerate(split):
            if index is not None:
                kinds.append("caller")
                continue
            kind = self.kind(fn, mod) if fn else _unnamed(self.kind(None, mod), mod)
            if kind is None and forwards and i < len(forwards) and forwards[i] and _all_passed(kinds):
                kind, guessed = "guessed-wrapper", True
            if kind in PASSED_OVER or kind == "unknown" or (kind == "interpreter" and read_above[i]):
                kinds.append(kind)  # the interpreter's own frames, where the program's frames above say more
                continue
            index = i
            kinds.append("interpreter" if kind == "interpreter" else "culprit")
        function, module = split[index] if index is not None else (None, None)
        interp = index is not None and kinds[index] == "interpreter"
        label = function or (f"an unnamed function in {module} (no symbol)" if module else None)
        if function == "Interpreter" and _jit(module):
            label = JIT_INTERPRETED
        if label is None and any(split_frame(f) == (None, "[anon]") for f in frames):
            label = JIT_UNNAMED  # past the runtime's frames, only code a JIT generated, no perf map naming it
        caller, language = self._caller(split, index) if language_of(module) is None else (None, None)
        if caller and label:
            label = f"{label}, called from {language} {caller}"
        elif interp and label:  # no program frame to name: say whose function it is, and what is missing
            label = f"{label} (the interpreter's own; the script calling it unread)"
        source, clone = frame_details(frames[index]) if index is not None else (None, None)
        return Named(kinds, index, function, guessed and index is not None, interp, label, caller, source, clone)

    def _caller(self, split: list[tuple[str | None, str | None]], index: int | None) -> tuple[str | None, str | None]:
        """(the first frame in the program's own language above a native culprit that is not passed
        over, as its standard library's are; that language's name), or (None, None)."""
        if index is None:
            return None, None
        for fn, mod in split[index + 1 :]:
            lang = language_of(mod)
            if fn and lang is not None and self.kind(fn, mod) not in PASSED_OVER:
                return fn, lang.language
        return None, None


def _unnamed(module_kind: str | None, module: str | None) -> str | None:
    """The kind of a frame without a symbol, from its module: jemalloc's stripped internals are the
    allocator's; in an interpreter, a named frame above says more; in the program's own module it is
    the culprit, unnamed (naming its caller instead would blame the wrong code)."""
    if module_kind in PASSED_OVER:
        return module_kind
    if module_kind == "interpreter" or not module or module.startswith("[") or language_of(module):
        return "unknown"
    return None


_PERF_MAP = re.compile(r"^perf-\d+\.map$")


def _jit(module: str | None) -> bool:
    """The frame's code was generated at run time and named by the runtime's perf map."""
    return module is not None and _PERF_MAP.match(module) is not None


def _all_passed(kinds: list[str]) -> bool:
    return bool(kinds) and all(k in PASSED_OVER for k in kinds)


def frame_details(frame: str) -> tuple[str | None, str | None]:
    """(file:line, clone suffix) a native frame carries in its details, each None where it has none:
    `process_order (orderd.c:16, GCC clone .isra.0) [orderd]` -> (`orderd.c:16`, `.isra.0`)."""
    if language_of(split_frame(frame)[1]) is not None:
        return None, None  # a runtime's own frame: its file:line is part of its function's name here
    m = _FRAME.match(frame)
    said = (m["detail"] or m["more"] or "") if m else ""
    source = clone = None
    for part in said.split(", ") if said else []:
        c = _CLONE_DETAIL.match(part)
        if c:
            clone = c["clone"]
        elif _SOURCE.match(part) and source is None:
            source = part
    return source, clone


def split_frame(frame: str) -> tuple[str | None, str | None]:
    """(function, module) of a frame as the probes print it: `fn+0x1a [module]`, `fn (file.go:12)
    [module]` (Go; a native frame with its line, `fn (orderd.c:16) [module]`), either with more
    details (`fn+0x1a (GCC clone .isra.0) [module]`: the function is `fn`) or `[unknown] [module]`;
    a frame of a runtime's language, such as a Python frame `handle_order (/srv/orders.py:42)
    [python]`, is (`handle_order (orders.py:42)`, `python`)."""
    for lang in languages():  # first: such a frame has the Go frame's shape too
        p = lang.pattern.match(frame)
        if p:
            line = f":{p['line']}" if p["line"] else ""
            return f"{p['fn']} ({p['file'].rsplit('/', 1)[-1]}{line})", p["mod"]
    m = _FRAME.match(frame)
    if m:
        return m["fn"], m["mod"]
    u = _UNKNOWN.match(frame)
    if u:
        return None, u["mod"]
    return frame or None, None
