"""Helpers for functional tests: waiting on conditions and child processes we can kill."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from kmq.errors import MarkerDecodeError
from kmq.markers import QUEUE_LANE, RETRY_LANE, Marker, MarkerType, decode_all
from kmq.records import parse_queue_headers


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


class Child:
    """A child process whose output lines are kept and can be awaited."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str] = queue.Queue()
        self._cursor = 0
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._new.put(line.rstrip("\n"))

    def _drain(self, timeout_s: float) -> None:
        try:
            self.lines.append(self._new.get(timeout=timeout_s))
            while True:
                self.lines.append(self._new.get_nowait())
        except queue.Empty:
            pass

    def wait_for(self, pattern: str, timeout_s: float = 20.0, *, count: int = 1) -> list[str]:
        """Wait until ``count`` output lines match ``pattern`` (searched anywhere in the line)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            hits = [line for line in self.lines if regex.search(line)]
            if len(hits) >= count:
                return hits
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                tail = "\n".join(self.lines[-30:])
                raise AssertionError(
                    f"{self.name}: no {count} lines matching {pattern!r} in {timeout_s} s; "
                    f"exit={self.proc.poll()} last output:\n{tail}"
                )
            if self.proc.poll() is not None and self._new.empty():
                self._drain(0.2)
                if not [line for line in self.lines if regex.search(line)][count - 1 :]:
                    tail = "\n".join(self.lines[-30:])
                    raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{tail}")
            self._drain(min(remaining, 0.1))

    def events(self) -> list[dict[str, Any]]:
        """JSON lines printed so far (the demo worker's protocol)."""
        self._drain(0)
        out = []
        for line in self.lines:
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def kill(self, sig: int = signal.SIGKILL) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout=30)


class Children:
    """Every child a test started; all are killed by PID when the test ends."""

    def __init__(self) -> None:
        self.all: list[Child] = []

    def start(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv)
        self.all.append(child)
        return child

    def python(self, name: str, *args: str) -> Child:
        return self.start(name, [sys.executable, "-u", *args])

    def cleanup(self) -> None:
        for child in self.all:
            if child.proc.poll() is None:
                os.kill(child.proc.pid, signal.SIGKILL)
                child.proc.wait(timeout=30)

    def dump(self, last: int = 400) -> None:
        """Print each child's last ``last`` output lines: pytest shows them (captured in
        teardown) only for a test that failed, where they are what the failure is read from."""
        for child in self.all:
            child._drain(0.0)
            lines = child.lines[-last:]
            print(f"----- {child.name} (exit {child.proc.poll()}), last {len(lines)} lines -----")
            print("\n".join(lines))


def read_records(bootstrap_servers: str, topic: str, timeout_s: float = 10.0) -> list[Any]:
    """Every record on ``topic``, up to the high watermarks seen while reading."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        done: set[TopicPartition] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < len(tps) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
            for tp in tps:
                highwater = consumer.highwater(tp)
                if highwater is not None and consumer.position(tp) >= highwater:
                    done.add(tp)
        if len(done) < len(tps):
            raise AssertionError(f"could not read {topic} to its end in {timeout_s} s")
        return records
    finally:
        consumer.close()


@dataclass(frozen=True)
class NamedMarker:
    """A marker with the queue and message id of the record it names (markers carry
    neither since protocol version 2)."""

    marker: Marker
    queue: str
    message_id: str

    @property
    def type(self) -> MarkerType:
        return self.marker.type

    @property
    def reason(self) -> str:
        return self.marker.reason

    @property
    def attempt(self) -> int:
        return self.marker.attempt


def read_markers(
    bootstrap_servers: str, topics: Any, timeout_s: float = 10.0
) -> list[NamedMarker]:
    """Every decodable marker on ``topics.markers``, named after the record it is about
    (read from ``topics.queue`` or, for the retry lane, ``topics.retry``). A PROBE is about
    no record (a tracker's probe or beacon, or a consumer's "still here", whose fields at
    zero would name whatever record sits at offset 0): it is named after none."""
    names: dict[tuple[int, int, int], tuple[str, str]] = {}
    for lane, topic in ((QUEUE_LANE, topics.queue), (RETRY_LANE, topics.retry)):
        for record in read_records(bootstrap_servers, topic, timeout_s):
            message_id, _, _ = parse_queue_headers(record.headers)
            queue = (record.key or b"").decode("utf-8", "replace")
            names[(lane, record.partition, record.offset)] = (queue, message_id or "")
    out: list[NamedMarker] = []
    for record in read_records(bootstrap_servers, topics.markers, timeout_s):
        with contextlib.suppress(MarkerDecodeError):
            for marker in decode_all(record.value):
                where = (marker.lane, marker.partition, marker.offset)
                queue, message_id = (
                    ("", "") if marker.type is MarkerType.PROBE else names.get(where, ("", ""))
                )
                out.append(NamedMarker(marker, queue, message_id))
    return out


# -- a tracker's /metrics and probes ----------------------------------------------------

_SAMPLE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""  # not listening yet


Metrics = dict[str, dict[frozenset[tuple[str, str]], float]]


def scrape(port: int) -> Metrics:
    """``/metrics`` as {name: {labels: value}}."""
    status, body = get(port, "/metrics")
    assert status == 200, status
    return parse_metrics(body)


def parse_metrics(body: bytes) -> Metrics:
    """A Prometheus text exposition as {name: {labels: value}}."""
    out: Metrics = {}
    for line in body.decode().splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels or ""))
        out.setdefault(name, {})[pairs] = float(value)
    return out


def total(metrics: Metrics, name: str, **labels: str) -> float:
    """The sum over partitions of ``name``'s samples with ``labels``."""
    want = set(labels.items())
    return sum(v for k, v in metrics.get(name, {}).items() if want <= k)


def metric(port: int, name: str, **labels: str) -> float:
    """``name`` summed over its samples with ``labels``; -1 while the tracker does not serve
    /metrics yet."""
    status, body = get(port, "/metrics")
    return total(parse_metrics(body), name, **labels) if status == 200 else -1.0


def event_count(port: int, event: str) -> float:
    """A tracker's ``stats:`` count ``event`` (kmq_tracker_events_total); -1 as metric."""
    return metric(port, "kmq_tracker_events_total", event=event)
