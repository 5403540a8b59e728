"""Which tests scripts/test.sh runs in which part of a whole-suite run (the `hostwide` marker is
added at collection from this table, by tests/conftest.py; `alone` is marked in the test files)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Tests that change or read state the whole host shares, so that another test running at the same
# time would change what they see (`hostwide`): scripts/test.sh runs them one at a time, beside the
# other tests (docs/development.md). File, or file::test, and why.
HOSTWIDE = {
    # OOM kills: the kernel prints a kill's cgroup under a host-wide rate limit (10 reports per 5 s)
    # into a 128 KiB ring, and serve's OOM watch opens an incident for every kill on the host
    "e2e/test_cli_counters.py": "OOM loops; a system target counts every kill on the host",
    "e2e/test_pid_namespace.py": "OOM kills, and a system-wide oomkill probe",
    "kernel/test_facts_real.py": "an OOM kill read from the kernel log; a swap file",
    "probes/test_pressure_probes.py": "OOM kills and swap storms",
    "serve/test_container_oom.py": "OOM kills in containers without a swap limit; the OOM watch",
    "serve/test_cases.py": "an OOM loop under a supervisor; the OOM watch; verify finds errleak host-wide",
    "serve/test_serve.py": "the OOM watch counts every kill on the host",
    "serve/test_flight_recorder.py": "OOM kills under the OOM watch; the recorder samples every cgroup",
    "serve/test_browser.py": "the OOM watch",
    "serve/test_container_requests.py": "the OOM watch",
    "e2e/test_containers.py": "a server with the OOM watch",
    # swap storms and OOM kills put host PSI and swap-in over the playbook's pressure thresholds,
    # which outrank `healthy`; and `memdiag verify` finds a service host-wide by its command line
    "e2e/test_scenarios.py": "a swap storm and an OOM kill; expects healthy; runs errleak",
    "e2e/test_distro_nonheap.py": "a bulk load stalls the host in writeback (PSI), expects cache",
    "e2e/test_nonheap.py": "an OOM kill; page cache and rereads at a limit (host PSI); slab growth host-wide",
    "e2e/test_verify.py": "verify finds errleak host-wide, by its command line and then its name",
    "probes/test_reach.py": "runs errleak, which test_verify would find",
    "probes/test_memleak.py": "runs errleak, which test_verify would find",
    "serve/test_worker_deadline.py": "expects healthy over a 1 s window",
    "e2e/test_runtimes.py::test_a_bounded_go_cache_is_a_cache": "expects cache or healthy",
}


def collected(*args: str, env: dict | None = None) -> list[str]:
    """The test ids `pytest --collect-only` gives for args (paths, -m selections), run as a user would."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return [line for line in r.stdout.splitlines() if "::" in line]
