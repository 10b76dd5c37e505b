"""Shared pieces: the run context, child processes, payloads, percentiles, topics."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from kmq.dev.embedded import die_with_parent

JSON = dict[str, Any]

PAYLOAD_BYTES = 100
"""The mqperf convention: 100-byte messages unless stated otherwise."""

_STAMP = struct.Struct("<qq")  # sequence number, send time (time.monotonic_ns)


@dataclass
class Context:
    """Everything the sections share for one benchmark run."""

    bootstrap_servers: str
    session_timeout_ms: int
    quick: bool
    broker: str
    """What the broker is, for the report ("embedded Tansu" or the external address)."""
    work_dir: Path
    """Scratch directory for child logs and sample files."""
    broker_pid: int | None = None
    """The embedded broker's process, for its CPU time; None for an external broker."""
    results: JSON = field(default_factory=dict)
    """Section results so far, keyed by section name (later sections reuse earlier ones)."""
    profile_queues: int = 1
    """Logical queues of the profile section's runs."""
    profile_messages: int = 0
    """Messages of the profile section's runs; 0: its default (15,000 quick, 40,000 full)."""

    def say(self, text: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {text}", flush=True)


# -- payloads ---------------------------------------------------------------------------


def make_payload(seq: int, size: int = PAYLOAD_BYTES) -> bytes:
    """``size`` bytes that start with the sequence number and the send time."""
    stamp = _STAMP.pack(seq, time.monotonic_ns())
    return stamp + bytes(size - len(stamp)) if size > len(stamp) else stamp


def read_payload(payload: bytes) -> tuple[int, int]:
    """(sequence number, send time in monotonic ns) of a :func:`make_payload` payload."""
    seq, sent_ns = _STAMP.unpack_from(payload)
    return seq, sent_ns


# -- statistics -------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of ``values`` (need not be sorted); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


def summarize(values: Sequence[float]) -> JSON:
    """Count, p50, p95, p99 and max of a sample (milliseconds in, milliseconds out)."""
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": float(ordered[-1]) if ordered else None,
    }


def median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ratio(kmq: float | None, raw: float | None) -> float | None:
    if kmq is None or raw is None or raw == 0:
        return None
    return kmq / raw


# -- topics -----------------------------------------------------------------------------


def new_tag() -> str:
    return uuid.uuid4().hex[:8]


def reproduce(servers: str | None, run: Callable[[str], bool]) -> int:
    """The exit status of a broker reproduction (``bench.broker_*``): ``run`` on the broker
    at ``servers``, or on an embedded one started for it; 1 when it reports the fault."""
    import logging

    from kmq.dev.embedded import EmbeddedBroker

    logging.basicConfig(level=logging.CRITICAL)
    if servers:
        return int(run(servers))
    with EmbeddedBroker() as broker:
        return int(run(broker.bootstrap_servers))


def create_topics(bootstrap_servers: str, topics: dict[str, int]) -> None:
    """Create ``{name: partitions}`` and wait until every one is listed."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="kmq-bench-admin")
    try:
        admin.create_topics([NewTopic(name, n, 1) for name, n in topics.items()])
        deadline = time.monotonic() + 30
        while not set(topics) <= set(admin.list_topics()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"topics {sorted(topics)} never became visible")
            time.sleep(0.05)
    finally:
        admin.close()


def delete_topics(bootstrap_servers: str, topics: Iterable[str]) -> None:
    """Best effort: keeps the in-memory broker small between runs."""
    names = list(topics)
    if not names:
        return
    with contextlib.suppress(Exception):
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="kmq-bench-admin")
        try:
            admin.delete_topics(names)
        finally:
            admin.close()


# -- processes --------------------------------------------------------------------------


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in KiB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(rest.split()[0])
    return out


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Child:
    """A child process; JSON lines on its stdout are events, other lines are kept as text."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in terminate()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            preexec_fn=die_with_parent(),  # never outlive the benchmark
        )
        self.lines: list[str] = []
        self._events: queue.Queue[JSON] = queue.Queue()
        self._seen: list[JSON] = []
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    self._events.put(json.loads(line))

    def wait_event(self, event: str, timeout_s: float) -> JSON:
        """The first event named ``event``; raise if the child dies or time runs out."""
        for seen in self._seen:
            if seen.get("event") == event:
                self._seen.remove(seen)
                return seen
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"{self.name}: no {event!r} event in {timeout_s:.0f} s")
            try:
                got = self._events.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self._events.empty():
                    self._reader.join(timeout=1)
                    if self._events.empty():
                        raise RuntimeError(
                            f"{self.name} exited with {self.proc.returncode} before {event!r}; "
                            f"see {self.log_path}:\n{self.tail()}"
                        ) from None
                continue
            if got.get("event") == "error":
                raise RuntimeError(f"{self.name} failed: {got.get('error')}\n{self.tail()}")
            if got.get("event") == event:
                return got
            self._seen.append(got)

    def wait_line(self, needle: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: no line with {needle!r}; see {self.log_path}")

    def tail(self, lines: int = 20) -> str:
        self._log.flush()
        try:
            text = self.log_path.read_text().splitlines()[-lines:]
        except OSError:
            text = []
        return "\n".join(self.lines[-lines:] + text)

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; both by PID."""
        try:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                return self.proc.wait(timeout=30)
        finally:
            self._reader.join(timeout=2)
            self._log.close()


class Children:
    """Every child of a run, killed by PID when the run ends however it ends."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.all: list[Child] = []

    def python(self, name: str, *args: str) -> Child:
        log_path = self.ctx.work_dir / f"{len(self.all):03d}-{name}.log"
        child = Child(name, [sys.executable, *args], log_path)
        self.all.append(child)
        return child

    def worker(self, name: str, role: str, args: JSON) -> Child:
        return self.python(name, "-m", "bench.worker", role, json.dumps(args))

    def close(self) -> None:
        for child in reversed(self.all):
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    child.proc.wait(timeout=30)
            with contextlib.suppress(Exception):
                child._log.close()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- environment ------------------------------------------------------------------------


def hardware() -> JSON:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
                break
    import kafka

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "kafka_python": kafka.__version__,
    }


def code_fingerprint() -> str:
    """A hash of the kmq and tracker sources, to tell which code a run measured."""
    import hashlib

    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in ("kmq", "tracker", "proto"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".proto") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0
