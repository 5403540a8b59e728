"""The alert loop's real components besides memdiag serve and Alertmanager (tests/serve/conftest.py):
Debian's process-exporter and Prometheus on loopback ports of their own, the shipped rules and
Alertmanager receiver turned into test-speed copies by documented, mechanical rewrites, and the
timestamps Prometheus itself keeps (first sample of growth, first evaluation firing).

Test speed: the rules run on a clock SPEED_UP times faster. Every time constant in them is divided
by SPEED_UP and nothing else changes: the durations (range selectors `[30m]`, `for:` holds) and the
seconds in an hour (`deriv(...) * 3600`, a rate per hour; `predict_linear(..., 3600)`, an hour
ahead). The byte thresholds stay as shipped, so "more than 64 MiB an hour" becomes more than 64 MiB
in 20 s (3.2 MiB/s) and "20 % of its size an hour" 20 % in 20 s: a workload fires the copy only
if it leaks SPEED_UP times faster than the shipped floor, and noise is judged as the shipped rules
judge it (scaling the windows alone would leave a 64 MiB/h floor of 178 KiB per 10 s window)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "memdiag-rules.yml"
RECEIVER = ROOT / "deploy" / "alertmanager-receiver.yml"
SPEED_UP = 180  # 30 min windows -> 10 s, 15 min holds -> 5 s, an hour -> 20 s
HOUR = "3600"
LEAK_KIB_S = 6144  # the loop's leak, 6 MiB/s: about twice the copy's floor of 64 MiB in 20 s (its hour)
# A time constant in the rules: a duration inside a range selector's brackets or as a rule's whole
# `for:` value, or the number of seconds in an hour.
TIME = re.compile(r"((?:(?<=\[)|(?<=^\s{8}for: ))\d+(?:ms|[smhdwy])(?=\]|$)|(?<![\w.])3600(?![\w.]))", re.M)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}


def _ms(duration: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(ms|[smhdwy])", duration).groups()
    return int(number) * _UNIT_MS[unit]


def scaled_time(constant: str, speed_up: int = SPEED_UP) -> str:
    """One time constant of the rules divided by speed_up: 3600 (seconds) as a number, a duration
    in whole seconds where it divides, else in ms."""
    if constant == HOUR:
        return str(int(HOUR) // speed_up)
    ms = round(_ms(constant) / speed_up)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def scaled_rules(text: str, speed_up: int = SPEED_UP) -> str:
    """The rules file on a clock speed_up times faster: every time constant divided, nothing else."""
    assert int(HOUR) % speed_up == 0, speed_up
    return TIME.sub(lambda m: scaled_time(m.group(1), speed_up), text)


def time_changes(shipped: str, copy: str) -> list[tuple[str, str]]:
    """(shipped, copy) per time constant of the shipped text, when the copy is the shipped text
    with only those constants replaced; AssertionError when anything else differs."""
    parts = TIME.split(shipped)
    shape = "(.+?)".join(re.escape(text) for text in parts[::2])
    found = re.fullmatch(shape, copy, re.S)
    assert found, "the copy differs from the shipped rules in more than their time constants"
    return list(zip(parts[1::2], found.groups(), strict=True))


def receiver_config(webhook_url: str, token_file: Path, group_wait: str = "1s", group_interval: str = "5s") -> str:
    """The shipped Alertmanager receiver (deploy/alertmanager-receiver.yml) pointed at a test server:
    its webhook URL and token file replaced, its memdiag route's group_wait and group_interval shortened.
    The matchers, grouping and receivers are the shipped ones."""
    config = yaml.safe_load(RECEIVER.read_text())
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "memdiag"]
    route.update(group_wait=group_wait, group_interval=group_interval)
    (receiver,) = [r for r in config["receivers"] if r["name"] == "memdiag"]
    (hook,) = receiver["webhook_configs"]
    hook["url"] = webhook_url
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return yaml.safe_dump(config, sort_keys=False)


def get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def get_text(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    """A server with its output in a log file (a pipe nobody reads would stall a chatty server)."""
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def _wait(what: str, proc: subprocess.Popen, log: Path, ready, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            if ready():
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s: {log.read_text(errors='replace')[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)


@contextlib.contextmanager
def process_exporter(folder: Path, port: int, exes: list[Path]) -> Iterator[str]:
    """Debian's prometheus-process-exporter on 127.0.0.1:port, one group per process of the given
    executables, named "{{.Comm}}:{{.PID}}" (what gives MemoryProcessGrowth its pid); its address."""
    config = folder / "process-exporter.yml"
    groups = [{"name": "{{.Comm}}:{{.PID}}", "exe": [str(e) for e in exes]}]
    config.write_text(yaml.safe_dump({"process_names": groups}))
    address = f"127.0.0.1:{port}"
    log = folder / "process-exporter.log"
    cmd = ["prometheus-process-exporter", f"-web.listen-address={address}", f"-config.path={config}", "-threads=false"]
    proc = _start(cmd, log)
    try:
        _wait("process-exporter", proc, log, lambda: get_text(f"http://{address}/metrics") is not None)
        yield address
    finally:
        _stop(proc)


class Prometheus:
    """Debian's prometheus on 127.0.0.1:port, scraping one target and evaluating one rules file
    every second, sending alerts to one Alertmanager; a fresh storage folder under `folder`."""

    def __init__(self, folder: Path, port: int, target: str, rules: Path, alertmanager: str):
        self.url = f"http://127.0.0.1:{port}"
        self.config = folder / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
                    "scrape_configs": [{"job_name": "process", "static_configs": [{"targets": [target]}]}],
                }
            )
        )
        self.cmd = [
            "prometheus",
            f"--config.file={self.config}",
            f"--storage.tsdb.path={folder / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        self.log = folder / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Prometheus:
        self.proc = _start(self.cmd, self.log)
        try:  # ready, and the exporter scraped once: a workload started now is seen from its start
            _wait("prometheus", self.proc, self.log, lambda: self.query('up{job="process"} == 1'))
        except BaseException:
            _stop(self.proc)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def query(self, expr: str) -> list[dict]:
        answer = get_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def samples(self, selector: str, window: str = "10m") -> list[tuple[float, float]]:
        """Every stored (timestamp, value) of the one series the selector names, oldest first."""
        result = self.query(f"{selector}[{window}]")
        assert len(result) <= 1, result
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []

    def first_growth(self, selector: str) -> float | None:
        """The timestamp of the first scrape whose value is above the one before: the exporter's
        first sample showing growth."""
        values = self.samples(selector)
        return next((t for (_, before), (t, v) in zip(values, values[1:], strict=False) if v > before), None)

    def first_firing(self, alertname: str) -> list[tuple[float, dict]]:
        """(first evaluation firing, labels) per series of the alert, from Prometheus's ALERTS series."""
        result = self.query(f'ALERTS{{alertname="{alertname}", alertstate="firing"}}[10m]')
        return [(float(r["values"][0][0]), r["metric"]) for r in result]
