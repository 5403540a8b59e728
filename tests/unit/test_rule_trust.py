"""Rule files are bounded before they are parsed and policy comes only from trusted places: real
files, FIFOs, devices, owners and modes on the real filesystem (no kernel probes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from memdiag.rules.loader import (
    MAX_ALIAS_NODES,
    RuleFileError,
    load_file,
    load_file_parts,
    load_playbook,
    playbook_paths,
)
from memdiag.rules.source import MAX_BYTES, read_at_most, untrusted_reason

RULE = "  - id: {id}\n    description: d\n    when: process.rss > 1GiB\n    then: {{finding: x}}\n"
NOBODY = 65534


def billion_laughs(levels: int = 9) -> str:
    out = ['rules:\n  - &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n']
    for i in range(1, levels):
        out.append(f"  - &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n")
    return "".join(out)


@pytest.fixture
def book(tmp_path) -> Path:
    """A folder as an admin makes it: root's (or ours), 0755."""
    folder = tmp_path / "book"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    return folder


def _write(folder: Path, text: str, name: str = "site.yaml", mode: int = 0o644) -> Path:
    p = folder / name
    p.write_text(text)
    p.chmod(mode)
    return p


def _error(path: Path, **kw) -> str:
    with pytest.raises(RuleFileError) as e:
        load_file(path, **kw)
    assert len(e.value.errors) == 1, e.value.errors
    return e.value.errors[0]


def test_billion_laughs_is_refused_at_the_alias_that_blows_the_budget_fast(book):
    bomb = _write(book, billion_laughs())
    t0 = time.monotonic()
    err = _error(bomb)
    assert time.monotonic() - t0 < 5  # a bomb let through runs for minutes
    # *a3 is the first alias whose expansion passes 10,000 nodes: 9 * 9^3 lols on line 6
    assert err == (
        f"{bomb}:6: alias `*a3` expands the file past {MAX_ALIAS_NODES} nodes (a YAML alias bomb?); "
        "an anchor may be reused only a little"
    )


def test_an_anchor_reused_a_little_still_works(book):
    text = (
        "rules:\n"
        "  - id: a\n    description: &why shared description\n    when: &big process.rss > 1GiB\n"
        "    then: &note {finding: x}\n"
        "  - id: b\n    description: *why\n    when: *big\n    then: *note\n"
    )
    rules = load_file(_write(book, text))
    assert [(r.id, r.description) for r in rules] == [("a", "shared description"), ("b", "shared description")]
    assert rules[1].source == f"{book / 'site.yaml'}:6"


def test_an_alias_inside_its_own_anchor_and_deep_nesting_are_refused(book):
    assert _error(_write(book, "rules: &r [*r]\n")).endswith(":1: alias `*r` refers to the node that contains it")
    deep = _write(book, "rules:\n  - " + "[" * 200_000 + "\n", name="deep.yaml")
    t0 = time.monotonic()
    assert _error(deep) == f"{deep}:2: nested deeper than 64 levels"
    assert time.monotonic() - t0 < 5  # a bomb let through runs for minutes


def test_python_tags_are_not_constructed(book):
    p = _write(book, "rules:\n  - id: !!python/object/apply:os.system ['touch /tmp/pwned']\n")
    tag = "tag:yaml.org,2002:python/object/apply:os.system"
    assert _error(p) == f"{p}:2: the tag `{tag}` is not allowed in a rule file"
    q = _write(book, "rules:\n  - id: !custom x\n", name="custom.yaml")
    assert _error(q) == f"{q}:2: the tag `!custom` is not allowed in a rule file"


def test_size_cap_on_what_is_read(book):
    p = book / "huge.yaml"
    with p.open("wb") as f:
        f.write(b"rules:\n" + b" " * (50 << 20))
    p.chmod(0o644)
    t0 = time.monotonic()
    assert _error(p) == f"{p}: larger than the 1 MiB limit for a rule file ({(50 << 20) + 7} bytes)"
    assert time.monotonic() - t0 < 5  # a bomb let through runs for minutes
    at_cap = _write(book, RULE.format(id="x").join(["rules:\n", ""]).ljust(MAX_BYTES, " "), name="cap.yaml")
    assert [r.id for r in load_file(at_cap)] == ["x"]  # exactly 1 MiB still loads


def test_fifo_device_folder_are_refused_without_blocking(book):
    fifo = book / "fifo.yaml"
    os.mkfifo(fifo, 0o644)
    t0 = time.monotonic()
    assert _error(fifo) == f"{fifo}: a FIFO, not a regular file; a rule file must be one"
    assert _error(Path("/dev/zero")) == "/dev/zero: a character device, not a regular file; a rule file must be one"
    (book / "dir.yaml").mkdir()
    assert _error(book / "dir.yaml").endswith("dir.yaml: a folder, not a regular file; a rule file must be one")
    assert time.monotonic() - t0 < 5  # a bomb let through runs for minutes
    # a folder of playbooks refuses the file that is not one, by name, and keeps every error
    _write(book, RULE.format(id="fine").join(["rules:\n", ""]))
    with pytest.raises(RuleFileError) as e:
        load_playbook(playbook_paths([book], site=book / "none"))
    assert [m.split(": ", 1)[0] for m in e.value.errors] == [str(book / "dir.yaml"), str(fifo)]


def test_world_or_group_writable_files_and_folders_are_not_policy(book):
    p = _write(book, RULE.format(id="site-rule").join(["rules:\n", ""]), mode=0o666)
    assert _error(p) == (
        f"{p}: not trusted policy: {p} is writable by group and others (mode 0666); fix: chmod go-w {p}"
    )
    assert [r.id for r in load_file(p, trusted=False)] == ["site-rule"]  # linting still reads it
    p.chmod(0o620)
    assert "is writable by its group (mode 0620); fix: chmod go-w" in _error(p)
    p.chmod(0o644)
    assert [r.id for r in load_file(p)] == ["site-rule"]
    book.chmod(0o757)
    assert _error(p) == (f"{p}: not trusted policy: {book} is writable by others (mode 0757); fix: chmod go-w {book}")
    with pytest.raises(RuleFileError, match=f"{book}: not trusted policy: {book} is writable by others"):
        playbook_paths([book], site=book / "none")


def test_files_owned_by_another_user_are_not_policy(root_required, book):
    p = _write(book, RULE.format(id="theirs").join(["rules:\n", ""]))
    os.chown(p, NOBODY, NOBODY)
    assert _error(p) == f"{p}: not trusted policy: {p} is owned by uid {NOBODY}, not root; fix: chown root {p}"
    os.chown(p, 0, 0)
    os.chown(book, NOBODY, NOBODY)
    assert f"{book} is owned by uid {NOBODY}, not root; fix: chown root {book}" in _error(p)


def test_a_symlink_is_judged_by_where_it_leads(book, tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    target = _write(loose, RULE.format(id="via-link").join(["rules:\n", ""]))
    link = book / "link.yaml"
    link.symlink_to(target)
    assert f"{loose} is writable by group and others (mode 0777)" in _error(link)
    loose.chmod(0o755)
    assert [r.id for r in load_file(link)] == ["via-link"]


def test_sticky_folders_above_are_fine_but_not_the_files_own_folder(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    p = _write(sticky, RULE.format(id="s").join(["rules:\n", ""]))
    assert f"{sticky} is writable by group and others (mode 1777)" in untrusted_reason(p)
    inner = sticky / "inner"
    inner.mkdir(mode=0o755)
    q = _write(inner, RULE.format(id="s").join(["rules:\n", ""]))
    assert untrusted_reason(q) is None


def test_the_working_folders_playbooks_are_not_policy(tmp_path, monkeypatch, book):
    (tmp_path / "playbooks").mkdir()
    _write(tmp_path / "playbooks", RULE.format(id="planted").join(["rules:\n", ""]))
    monkeypatch.chdir(tmp_path)
    paths = playbook_paths(site=tmp_path / "no-such-site")
    assert all("planted" not in p.read_text() for p in paths) and all(p.parent.name == "playbooks" for p in paths)
    assert {r.id for r in load_playbook(paths).rules}.isdisjoint({"planted"})


def test_the_site_folder_is_loaded_after_the_shipped_playbook(book, monkeypatch):
    site = _write(book, RULE.format(id="site-ceiling").join(["rules:\n", ""]))
    monkeypatch.setenv("MEMDIAG_PLAYBOOK_DIR", str(book))
    rules = load_playbook(playbook_paths()).rules
    assert rules[-1].id == "site-ceiling" and rules[-1].source == f"{site}:2"
    assert rules[0].source.split(":")[0].endswith("default.yaml")


def test_text_that_is_not_yaml_or_not_utf8_gets_one_line_with_its_line(book):
    ctl = _write(book, "rules:\n  - id: a\x01\n", name="ctl.yaml")
    assert _error(ctl) == f"{ctl}:2: not valid YAML: character U+0001: control characters are not allowed"
    raw = book / "latin1.yaml"
    raw.write_bytes(b"rules:\n  - id: caf\xe9\n")
    assert _error(raw) == f"{raw}:2: not UTF-8 text (byte 18)"
    key = _write(book, "{[a]: 1}\n", name="key.yaml")
    assert _error(key) == f"{key}:1: a key must be a plain name"


# --- attack review 1: bytes, scalars, special files -------------------------------------------------

VERDICT_RULE = (
    "rules:\n  - id: v\n    description: d\n    when: process.rss > 1GiB\n    then:\n      verdict: {verdict}\n"
)


def test_aliases_are_budgeted_by_the_bytes_they_repeat(book):
    """A 60 KB id reused 3000 times is 180 MB of text (and of error lines) from a 100 KB file."""
    bomb = _write(book, 'rules:\n  - {id: &s "' + "y" * 60_000 + '"}\n' + "  - {id: *s}\n" * 3000)
    # each alias repeats 60,000 bytes: the 18th (line 20) passes 1 MiB
    assert _error(bomb) == (
        f"{bomb}:20: alias `*s` expands the file past 1 MiB (a YAML alias bomb?); an anchor may be reused only a little"
    )
    few = _write(book, 'rules:\n  - {id: &s "' + "y" * 60_000 + '"}\n' + "  - {id: *s}\n" * 2, name="few.yaml")
    with pytest.raises(RuleFileError) as e:
        load_file(few)
    # within the budget the errors name the rule by a short prefix of its id, not 60 KB each
    assert e.value.errors[0] == f"{few}:2: rule {'y' * 59}… when: Field required"
    assert max(len(m) for m in e.value.errors) < 200


def test_errors_stop_at_fifty_and_count_the_rest(book):
    many = _write(book, "rules: [" + ",".join(["a"] * 5000) + "]\n")
    with pytest.raises(RuleFileError) as e:
        load_file(many)
    assert len(e.value.errors) == 50 and e.value.more == 4950
    assert e.value.errors[49] == f"{many}:1: rule 49: Input should be a valid dictionary or instance of Rule"
    lines = e.value.usage_text().splitlines()
    assert lines[0] == "bad rule files:" and len(lines) == 52 and lines[-1] == "  ... and 4950 more"
    # across files too: the second file's errors are counted, not kept
    other = _write(book, "rules: [" + ",".join(["b"] * 3000) + "]\n", name="other.yaml")
    with pytest.raises(RuleFileError) as e:
        load_playbook([many, other], trusted=False)
    assert len(e.value.errors) == 50 and e.value.more == 7950
    # one error line is cut, however long the text it quotes
    long = _write(
        book, "rules:\n" + RULE.format(id="x").replace("process.rss", "process." + "z" * 5000), name="long.yaml"
    )
    with pytest.raises(RuleFileError) as e:
        load_file(long)
    assert "unknown fact `process.zzz" in e.value.errors[0]
    assert len(e.value.errors[0]) == 1000 and e.value.errors[0].endswith("…")


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("1" * 5000, ":2: a number of 5000 characters; at most 100"),
        ("0x" + "f" * 5000, ":2: a number of 5002 characters; at most 100"),
        ("!!int abc", ":2: `abc` is not a valid int (tagged !!int)"),
        ("!!float abc", ":2: `abc` is not a valid float (tagged !!float)"),
        ("!!bool maybe", ":2: `maybe` is not a valid bool (tagged !!bool)"),
        ("!!null x", ":2: `x` is not a valid null (tagged !!null)"),
        ("!!timestamp abc", ":2: the tag `tag:yaml.org,2002:timestamp` is not allowed in a rule file"),
        ("!!binary aGk=", ":2: the tag `tag:yaml.org,2002:binary` is not allowed in a rule file"),
        ("!!set {a: null}", ":2: the tag `tag:yaml.org,2002:set` is not allowed in a rule file"),
    ],
    ids=[
        "int-5000-digits",
        "hex-5000-digits",
        "int-abc",
        "float-abc",
        "bool-maybe",
        "null-x",
        "timestamp",
        "binary",
        "set",
    ],
)
def test_a_scalar_that_cannot_be_built_is_a_rule_file_error_with_its_line(book, value, expect):
    p = _write(book, RULE.format(id=value).join(["rules:\n", ""]))
    assert _error(p) == f"{p}{expect}"


def test_scalars_are_typed_by_the_yaml_1_2_core_schema(book):
    """No YAML 1.1: a date, 1:20 and yes stay text; hex, octal and tagged numbers are numbers."""
    dated = _write(book, RULE.format(id="2020-02-30").join(["rules:\n", ""]))
    assert [r.id for r in load_file(dated)] == ["2020-02-30"]  # was a ValueError: day is out of range
    verdict = "{{kind: growth, summary: s, confidence: {c}, priority: {p}}}"
    for c, p, want in [("!!float 0x1", "0x10", (1.0, 16)), (".5", "0o17", (0.5, 15)), ("1e-1", "-3", (0.1, -3))]:
        f = _write(book, VERDICT_RULE.format(verdict=verdict.format(c=c, p=p)), name="v.yaml")
        v = load_file(f)[0].then.verdict
        assert (v.confidence, v.priority) == want
    sexagesimal = _write(book, VERDICT_RULE.format(verdict=verdict.format(c="1.0", p="1:20")), name="s.yaml")
    assert "priority: Input should be a valid integer" in _error(sexagesimal)  # 1:20 is text, not 80
    yes = _write(book, "wrappers:\n  - {kind: wrapper, function: yes, note: on}\n", name="w.yaml")
    assert [(w.function, w.note) for w in load_file_parts(yes).wrappers] == [("yes", "on")]


def test_a_base_60_megabyte_scalar_is_refused_before_it_is_built(book):
    """YAML 1.1 built `1:59:59:...` quadratically: 24 s of CPU for 1 MiB."""
    p = book / "sexagesimal.yaml"
    p.write_text("rules:\n  - id: 1" + ":59" * 349_000 + "\n")
    p.chmod(0o644)
    t0 = time.monotonic()
    assert _error(p) == f"{p}:2: a scalar of {1 + 3 * 349_000} characters; at most 65536"
    assert time.monotonic() - t0 < 10  # a hang check, not a timing test: it took 24 s


@pytest.mark.parametrize(
    ("path", "fs"),
    [
        ("/proc/self/status", "procfs"),
        ("/proc/kmsg", "procfs"),
        ("/sys/kernel/mm/transparent_hugepage/enabled", "sysfs"),
    ],
)
def test_files_of_kernel_filesystems_are_refused_unread(path, fs):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this kernel")
    assert _error(Path(path), trusted=False) == (
        f"{path}: a file of {fs} (a kernel interface), not a rule file; refused unread"
    )


def test_a_trace_pipe_is_refused_unread(root_required):
    """A tracing instance's trace_pipe is a root-owned regular file whose read takes the events
    from its other readers (or fails with EAGAIN when there are none)."""
    tracing = Path("/sys/kernel/tracing")
    if not (tracing / "instances").is_dir():
        pytest.skip("no tracefs at /sys/kernel/tracing")
    instance = tracing / "instances" / f"memdiag-rulefix-{os.getpid()}"
    instance.mkdir()
    try:
        pipe = instance / "trace_pipe"
        assert _error(pipe) == f"{pipe}: a file of tracefs (a kernel interface), not a rule file; refused unread"
    finally:
        instance.rmdir()


def test_an_error_while_reading_is_a_rule_file_error():
    """EAGAIN from a real non-blocking read with nothing to read (a pipe: no kernel file needed)."""
    r, w = os.pipe2(os.O_NONBLOCK)
    try:
        with pytest.raises(RuleFileError) as e:
            read_at_most(r, 100, Path("/etc/x.yaml"))
        assert e.value.errors == ["/etc/x.yaml: cannot read (Resource temporarily unavailable)"]
        os.write(w, b"rules: []\n")
        os.close(w)
        w = -1
        assert read_at_most(r, 100, Path("/etc/x.yaml")) == b"rules: []\n"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
