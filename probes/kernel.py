"""What this kernel offers BPF probes, checked before anything is loaded, and the environment bcc
needs to compile against it (kernel headers, tracefs).

Each check returns an Availability with the reason, so a probe that cannot run says why
("kprobes not compiled into this kernel") and the diagnosis goes on without it."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
import platform
import subprocess
from pathlib import Path

from memdiag.system import arch
from memdiag.system._parse import Model
from pydantic import ConfigDict

PRIVATE_HEADERS = Path("/var/lib/memdiag/kernel-headers")


class Availability(Model):
    model_config = ConfigDict(frozen=True)

    available: bool
    reason: str


def _config_option(option: str, proc_root: Path) -> str | None:
    """'y', 'm', 'n' for CONFIG_<option> from /proc/config.gz, None when the config is not exposed."""
    try:
        with gzip.open(proc_root / "config.gz", "rt") as f:
            for line in f:
                if line.startswith(f"CONFIG_{option}="):
                    return line.strip().split("=", 1)[1]
                if line.startswith(f"# CONFIG_{option} is not set"):
                    return "n"
    except OSError:
        return None
    return "n"


def tracefs_root(sys_root: Path = Path("/sys")) -> Path | None:
    for candidate in (sys_root / "kernel" / "tracing", sys_root / "kernel" / "debug" / "tracing"):
        if (candidate / "events").is_dir():
            return candidate
    return None


def ensure_tracefs() -> Path | None:
    """bcc reads tracepoints under /sys/kernel/debug/tracing; mount debugfs/tracefs when missing
    (root only). Returns the tracefs root in use, or None."""
    debug_tracing = Path("/sys/kernel/debug/tracing")
    if not (debug_tracing / "events").is_dir() and os.geteuid() == 0:
        subprocess.run(["mount", "-t", "debugfs", "debugfs", "/sys/kernel/debug"], capture_output=True)
        if not (debug_tracing / "events").is_dir():
            subprocess.run(["mount", "-t", "tracefs", "tracefs", str(debug_tracing)], capture_output=True)
    return tracefs_root()


def kernel_headers(release: str | None = None) -> Path | None:
    """The header tree bcc will compile against: the running kernel's own, else the generic
    fallback the set-up prepared (custom kernels have no distro headers)."""
    release = release or platform.release()
    own = Path("/lib/modules") / release / "build"
    if (own / "include").is_dir():
        return own
    private = PRIVATE_HEADERS / release
    if (private / "include").is_dir():
        return private
    return None


def bpf_runtime() -> Availability:
    """What loading and attaching any program needs: this machine's layout (system/arch.py), root and
    tracefs (tracepoint ids)."""
    if not arch.supported():
        return Availability(available=False, reason=arch.refusal())
    if os.geteuid() != 0:
        return Availability(available=False, reason="BPF probes need root (CAP_BPF and CAP_PERFMON)")
    if ensure_tracefs() is None:
        return Availability(available=False, reason="tracefs is not mounted and could not be mounted")
    return Availability(available=True, reason="root and tracefs")


def prepare_bcc_environment() -> Availability:
    """Point bcc at usable headers (BCC_KERNEL_SOURCE, inherited by the compiler's child process);
    check root, tracefs and that bcc is installed (found, not imported)."""
    runtime = bpf_runtime()
    if not runtime.available:
        return runtime
    headers = kernel_headers()
    if "BCC_KERNEL_SOURCE" not in os.environ and headers is not None and not str(headers).startswith("/lib/modules"):
        os.environ["BCC_KERNEL_SOURCE"] = str(headers)
    if headers is None and "BCC_KERNEL_SOURCE" not in os.environ and not Path("/sys/kernel/kheaders.tar.xz").exists():
        return Availability(
            available=False,
            reason=f"no kernel headers for {platform.release()} (run scripts/setup.sh, or install "
            f"linux-headers-{platform.release()})",
        )
    # Found, not imported: importing bcc maps LLVM (~64 MiB); only the compiler child imports it.
    if importlib.util.find_spec("bcc") is None:
        return Availability(available=False, reason="bcc's Python module is not importable (install python3-bpfcc)")
    return Availability(available=True, reason="bcc ready")


def tracepoint(category: str, name: str, sys_root: Path = Path("/sys")) -> Availability:
    root = tracefs_root(sys_root)
    if root is None:
        return Availability(available=False, reason="tracefs is not mounted")
    if (root / "events" / category / name / "id").exists():
        return Availability(available=True, reason=f"tracepoint {category}:{name}")
    return Availability(available=False, reason=f"tracepoint {category}:{name} does not exist in this kernel")


def kprobes(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> Availability:
    # bcc attaches kprobes through the kprobe PMU (4.17+) or, before it, tracefs kprobe_events.
    if (sys_root / "bus" / "event_source" / "devices" / "kprobe" / "type").exists():
        return Availability(available=True, reason="kprobe PMU")
    root = tracefs_root(sys_root)
    if root is not None and (root / "kprobe_events").exists():
        return Availability(available=True, reason="tracefs kprobe_events")
    config = _config_option("KPROBES", proc_root)
    why = "CONFIG_KPROBES is not set" if config == "n" else "no kprobe PMU and no kprobe_events"
    return Availability(available=False, reason=f"kprobes not compiled into this kernel ({why})")


def uprobes(sys_root: Path = Path("/sys")) -> Availability:
    if (sys_root / "bus" / "event_source" / "devices" / "uprobe" / "type").exists():
        return Availability(available=True, reason="uprobe PMU")
    root = tracefs_root(sys_root)
    if root is not None and (root / "uprobe_events").exists():
        return Availability(available=True, reason="tracefs uprobe_events")
    return Availability(available=False, reason="uprobes not compiled into this kernel (CONFIG_UPROBE_EVENTS)")


def perf_events(proc_root: Path = Path("/proc")) -> Availability:
    if (proc_root / "sys" / "kernel" / "perf_event_paranoid").exists():
        return Availability(available=True, reason="perf_event_open")
    return Availability(available=False, reason="perf events not compiled into this kernel (CONFIG_PERF_EVENTS)")


def raw_syscall_tracepoints(sys_root: Path = Path("/sys")) -> Availability:
    """Raw tracepoints on sys_enter/sys_exit (4.17+), with x86-64 pt_regs to read arguments from."""
    if not arch.supported():
        return Availability(available=False, reason=arch.refusal())
    for name in ("sys_enter", "sys_exit"):
        tp = tracepoint("raw_syscalls", name, sys_root)
        if not tp.available:
            return tp
    return Availability(available=True, reason="raw tracepoints raw_syscalls:sys_enter/sys_exit")


PROC_PID_INIT_INO = 0xEFFFFFFC  # the initial pid namespace's inode number (include/linux/proc_ns.h)


@functools.cache
def pid_namespace(proc_root: str = "/proc") -> tuple[int, int] | None:
    """The pid namespace /proc numbers processes in, as (device, inode) for the kernel's
    bpf_get_ns_current_pid_tgid(); None when it is the initial one, whose numbers BPF's
    bpf_get_current_pid_tgid() already gives. (Inside a container without the host's pid
    namespace, every pid memdiag reads is a number the kernel's own helper does not give.)"""
    for path in (f"{proc_root}/1/ns/pid", f"{proc_root}/self/ns/pid"):  # /proc's init is in its namespace
        try:
            st = os.stat(path)
            break
        except OSError:
            continue
    else:
        return None
    if st.st_ino == PROC_PID_INIT_INO:
        return None
    return (os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino  # the kernel's dev_t (MKDEV)


def pid_namespace_of(pid: int, proc_root: str = "/proc") -> int | None:
    """The inode of a process's pid namespace (None: gone or unreadable)."""
    try:
        return os.stat(f"{proc_root}/{pid}/ns/pid").st_ino
    except OSError:
        return None


def namespace_defines() -> dict[str, int | str]:
    """-D options that make every program name processes as /proc does (bpf/memdiag.h)."""
    ns = pid_namespace()
    return {} if ns is None else {"PIDNS_DEV": f"{ns[0]}ULL", "PIDNS_INO": f"{ns[1]}ULL"}


def pid_translation() -> Availability:
    """Whether BPF can name processes as /proc does: always in the initial pid namespace; in
    another, with bpf_get_ns_current_pid_tgid() (Linux 5.7)."""
    if pid_namespace() is None:
        return Availability(available=True, reason="memdiag runs in the initial pid namespace")
    release = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2] if x.isdigit())
    if release >= (5, 7):
        return Availability(available=True, reason="pid namespace: bpf_get_ns_current_pid_tgid (Linux 5.7)")
    return Availability(
        available=False,
        reason=f"memdiag runs in a pid namespace of its own and this kernel ({platform.release()}) lacks "
        "bpf_get_ns_current_pid_tgid (Linux 5.7): BPF sees the host's process ids, not these, so tracing "
        "cannot see the target; run memdiag in the host's pid namespace (e.g. a container with --pid=host)",
    )
