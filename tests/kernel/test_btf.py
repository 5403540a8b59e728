"""probes.btf on the running kernel's own BTF: the offsets oomkill's namespace translation is
compiled with, members inside anonymous unions, and what is missing or not BTF."""

import pytest
from memdiag.probes import btf


@pytest.fixture
def vmlinux():
    b = btf.vmlinux()
    if b is None:
        pytest.skip("this kernel has no BTF (/sys/kernel/btf/vmlinux)")
    return b


def test_offsets_of_the_pid_structs(vmlinux):
    # struct upid { int nr; struct pid_namespace *ns; } on a 64-bit kernel
    assert (vmlinux.offset("upid", "nr"), vmlinux.offset("upid", "ns"), vmlinux.size("upid")) == (0, 8, 16)
    # pid_t pid; pid_t tgid; side by side in task_struct since 2.6
    assert vmlinux.offset("task_struct", "tgid") == vmlinux.offset("task_struct", "pid") + 4
    # numbers[] is struct pid's flexible last member: it starts where the struct ends
    assert vmlinux.offset("pid", "numbers") == vmlinux.size("pid")


def test_a_member_of_an_anonymous_union_and_what_is_missing(vmlinux):
    assert vmlinux.offset("page", "lru") == 8  # after page.flags, inside the page's anonymous union
    assert vmlinux.offset("task_struct", "no_such_member") is None
    assert vmlinux.offset("no_such_struct", "pid") is None and vmlinux.size("no_such_struct") is None


def test_not_btf_is_refused():
    with pytest.raises(ValueError, match="not BTF"):
        btf.Btf(b"\0" * 64)
