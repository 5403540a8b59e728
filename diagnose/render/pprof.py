"""The report's stacks as gzipped pprof profiles (profile.proto, vendored in pprof_proto/ with its
generated module), for go tool pprof, Pyroscope, Parca, Grafana and speedscope.

profile.pb.gz holds the growth flame graph's stacks (growth.folded, every one of them) with the one
value its probe folds (outstanding bytes, page faults ...); profile.PROBE.pb.gz holds the stacks the
report lists of each probe, with both their bytes and their count as two sample types of the same
samples. A probe's face names what its bytes and counts are in pprof's terms (probes/face.py
Stacks.space, .counted). As in Go's and tcmalloc's heap profiles, the allocator's own frames at the
leaf (malloc, calloc: the playbook's `allocator` frames) are left out of a stack and named in its
sample's `allocator` label, so that pprof's flat column names the code that allocated. Values are
the totals the probes measured or estimated (period 1: nothing to scale). Frame names are the
target's strings: kept as data (one line, control characters escaped, bounded), never formatted."""

from __future__ import annotations

import gzip
import os
import re

from memdiag.probes.face import Stacks
from memdiag.probes.registry import REGISTRY

from ..culprit import default_classes, split_frame
from ..report import Report, StackReport
from .pprof_proto.profile_pb2 import Profile
from .text import one_line

NAME_MAX = 1024  # characters of a frame's name kept (a C++ template can be long; a hostile name longer)
DEPTH_MAX = 512  # frames of a stack kept, from the leaf (the probes' own stacks are shorter)
INT64_MAX = (1 << 63) - 1
# a frame with its source: `main.handle (main.go:30, inlined) [orderd]`, `handle_order (/srv/orders.py:42) [python]`
_SURROGATE = re.compile("[\ud800-\udfff]")  # no character of UTF-8: a byte that was not UTF-8, kept as one
_PROBE_NAME = re.compile(r"[a-z0-9_]{1,64}")
_JAVA = re.compile(r"^(?P<fn>.+?) line: (?P<line>\d{1,9})$")  # a Java method and its line (probes/jvm/recording.py)
# a line has at most 9 digits (a file's name is the binary's: `x.go:` and 5,000 digits is no line)
_SOURCE = re.compile(r"^(?P<fn>.+?) \((?P<file>[^()]+?):(?P<line>\d{1,9})(?:, [^()]*)?\) \[(?P<mod>[^\]]+)\]$")


def render_pprof(report: Report) -> dict[str, bytes]:
    """profile.pb.gz (the growth stacks; no sample when the report has none) and profile.PROBE.pb.gz
    for each probe with stacks in the report, gzipped, by name."""
    files = {"profile.pb.gz": _gzip(_growth(report))}
    for probe in dict.fromkeys(s.probe for s in report.stacks):
        if not _PROBE_NAME.fullmatch(probe):  # a file name: a report read back from JSON may say anything
            continue
        files[f"profile.{probe}.pb.gz"] = _gzip(_listed(report, probe, [s for s in report.stacks if s.probe == probe]))
    return files


def _stacks_of(probe: str | None) -> Stacks:
    """The probe's Stacks (what its figures are); a probe this memdiag does not know: the defaults."""
    face = REGISTRY.face(probe) if probe in REGISTRY.names else None
    return face.stacks if face is not None and face.stacks is not None else Stacks("events", 0, list, list)


def _growth(report: Report) -> Profile:
    # a report.json written before folded_probe was kept: its folded lines are its first stacks' probe's
    probe = report.folded_probe or (report.stacks[0].probe if report.stacks else None)
    st = _stacks_of(probe)
    kind = (st.space or "space", "bytes") if st.folded_by == "bytes" else (st.counted, "count")
    b = _Builder(report, [kind], f"growth stacks of {probe}" if probe else "no stacks recorded")
    classes = default_classes()  # folded lines carry no kinds: the shipped playbook's list names the allocator's
    for line in report.folded:
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            names = list(reversed(stack.split(";")))
            kinds = [classes.kind(n, None) for n in names]
            b.sample([(name, None, None, None) for name in names], [int(count)], kinds=kinds)
    return b.profile


def _listed(report: Report, probe: str, stacks: list[StackReport]) -> Profile:
    st = _stacks_of(probe)
    kinds = ([(st.space, "bytes")] if st.space else []) + [(st.counted, "count")]
    b = _Builder(report, kinds, f"the stacks the report lists of {probe}")
    framed = [[_frame(f) for f in s.frames] for s in stacks]
    t = report.target  # the program's own module first: pprof calls the first mapping the main binary
    own = {t.comm, os.path.basename(t.cmdline[0]) if t.cmdline else None} - {None}
    for module in dict.fromkeys(f[3] for frames in framed for f in frames if f[3] in own):
        b.mapping(module)  # type: ignore[arg-type]
    for s, frames in zip(stacks, framed, strict=True):
        values = ([s.bytes] if st.space else []) + [s.count]
        b.sample(frames, values, {"detail": s.detail}, kinds=s.frame_kinds)
    return b.profile


def _frame(frame: str) -> tuple[str, str | None, int | None, str | None]:
    """(function, file, line, module) of a frame as the probes print it (diagnose/culprit.py split_frame)."""
    m = _SOURCE.match(frame)
    if m:
        return m["fn"], m["file"], int(m["line"]), m["mod"]
    j = _JAVA.match(frame)
    if j:
        return j["fn"], None, int(j["line"]), None
    fn, mod = split_frame(frame)
    return fn or "[unknown]", None, None, mod


def _text(s: str) -> str:
    """A target's string as pprof may carry it: one line, bounded, valid UTF-8 (a lone surrogate, such
    as a name that was not UTF-8, becomes U+FFFD)."""
    s = one_line(s)
    s = s if len(s) <= NAME_MAX else s[: NAME_MAX - 1] + "…"
    return _SURROGATE.sub("\ufffd", s)


def _gzip(p: Profile) -> bytes:
    return gzip.compress(p.SerializeToString(), mtime=0)  # the same report, the same bytes


class _Builder:
    """One profile: its string table, and its functions, locations and mappings, each once."""

    def __init__(self, report: Report, kinds: list[tuple[str, str]], what: str):
        self.profile = p = Profile()
        self.strings: dict[str, int] = {}
        self.functions: dict[tuple[str, str], int] = {}
        self.locations: dict[tuple, int] = {}
        self.mappings: dict[str, int] = {}
        self.s("")  # string_table[0] is "" by the format's rule
        for typ, unit in kinds:
            p.sample_type.add(type=self.s(typ), unit=self.s(unit))
        p.default_sample_type = p.sample_type[0].type
        p.period_type.type, p.period_type.unit = p.sample_type[0].type, p.sample_type[0].unit
        p.period = 1  # every value is a total, not a sample to scale
        w = report.window
        p.time_nanos = int(w.started * 1e9)
        p.duration_nanos = max(0, int((w.ended - w.started) * 1e9))
        p.comment.append(self.s(f"memdiag {report.memdiag_version}: {what}"))
        p.comment.append(self.s(_text(f"target: {report.target.description}")))
        p.comment.append(self.s(f"verdict: {report.verdict.kind}"))

    def s(self, text: str) -> int:
        i = self.strings.get(text)
        if i is None:
            i = self.strings[text] = len(self.profile.string_table)
            self.profile.string_table.append(text)
        return i

    def sample(
        self,
        frames: list[tuple[str, str | None, int | None, str | None]],
        values: list[int],
        labels: dict[str, str] | None = None,
        kinds: list[str | None] | None = None,
    ) -> None:
        """One sample: frames leaf first (pprof's order), each a (function, file, line, module), less
        the allocator's frames at the leaf (kinds: diagnose/culprit.py's, per frame), named in a label."""
        labels = dict(labels or {})
        cut = 0
        while kinds and cut < min(len(kinds), len(frames)) - 1 and kinds[cut] == "allocator":
            cut += 1
        if cut:
            labels["allocator"] = " <- ".join(f[0] for f in frames[:cut])
        ids = [self.location(*f) for f in frames[cut : cut + DEPTH_MAX]]
        smp = self.profile.sample.add(location_id=ids, value=[min(max(v, 0), INT64_MAX) for v in values])
        for key, text in labels.items():
            smp.label.add(key=self.s(key), str=self.s(_text(text)))

    def location(self, fn: str, file: str | None, line: int | None, module: str | None) -> int:
        key = (fn, file, line, module)
        lid = self.locations.get(key)
        if lid is None:
            lid = self.locations[key] = len(self.profile.location) + 1
            loc = self.profile.location.add(id=lid, mapping_id=self.mapping(module) if module else 0)
            loc.line.add(function_id=self.function(fn, file), line=min(line or 0, INT64_MAX))
        return lid

    def function(self, fn: str, file: str | None) -> int:
        key = (fn, file or "")
        fid = self.functions.get(key)
        if fid is None:
            fid = self.functions[key] = len(self.profile.function) + 1
            name = self.s(_text(fn))
            self.profile.function.add(id=fid, name=name, system_name=name, filename=self.s(_text(file or "")))
        return fid

    def mapping(self, module: str) -> int:
        mid = self.mappings.get(module)
        if mid is None:
            mid = self.mappings[module] = len(self.profile.mapping) + 1
            # symbolized already: pprof looks for no binary to name its functions
            self.profile.mapping.add(id=mid, filename=self.s(_text(module)), has_functions=True)
        return mid
