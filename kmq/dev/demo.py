"""``kmq demo``: the whole system on one machine, with a worker killed mid-message."""

from __future__ import annotations

import json
import os
import queue as queue_mod
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from kmq.dev.embedded import EmbeddedBroker
from kmq.service import Service

QUEUES = ("emails", "invoices", "thumbnails")
QUEUE_TOPIC = "kmq.demo.queue"
MARKER_TOPIC = "kmq.demo.markers"


@dataclass
class Summary:
    sent: int = 0
    acked: int = 0
    deliveries: int = 0
    redelivered: int = 0
    killed: int = 0
    duplicates: int = 0
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and self.acked == self.sent


class _Processes:
    """Child processes whose stdout lines land in one queue; all killed on exit."""

    def __init__(self) -> None:
        self.lines: queue_mod.Queue[tuple[str, str]] = queue_mod.Queue()
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.procs[name] = proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines.put((name, line.rstrip("\n")))

        threading.Thread(target=pump, daemon=True).start()
        return proc

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_demo(
    messages: int = 30,
    bootstrap_servers: str | None = None,
    redelivery_timeout_s: float = 2.0,
    timeout_s: float = 120.0,
    say: Callable[[str], None] = print,
) -> Summary:
    summary = Summary()
    with ExitStack() as stack:
        if bootstrap_servers is None:
            broker = stack.enter_context(EmbeddedBroker())
            bootstrap_servers = broker.bootstrap_servers
            session_ms = 2000  # Tansu accepts short sessions; groups settle in about a second
            say(f"embedded broker on {bootstrap_servers}")
        else:
            session_ms = 6000  # Apache Kafka's group.min.session.timeout.ms
        service = stack.enter_context(
            Service(
                bootstrap_servers=bootstrap_servers,
                queue_topic=QUEUE_TOPIC,
                marker_topic=MARKER_TOPIC,
                redelivery_timeout_s=redelivery_timeout_s,
                session_timeout_ms=session_ms,
            )
        )
        service.ensure_topics()
        procs = _Processes()
        stack.callback(procs.stop_all)
        common = [
            "--bootstrap-servers",
            bootstrap_servers,
            "--queue-topic",
            QUEUE_TOPIC,
            "--marker-topic",
            MARKER_TOPIC,
        ]
        procs.spawn(
            "tracker",
            [
                sys.executable,
                "-m",
                "tracker",
                *common,
                "--session-timeout-ms",
                str(session_ms),
                "--stats-interval-s",
                "5",
            ],
        )

        sent: dict[str, str] = {}
        for i in range(messages):
            queue_id = QUEUES[i % len(QUEUES)]
            payload = json.dumps({"n": i, "queue": queue_id}).encode()
            sent[service.queue(queue_id).producer().send(payload)] = queue_id
        summary.sent = len(sent)
        say(f"sent {len(sent)} messages to queues {', '.join(QUEUES)}")

        def worker(name: str, queue_id: str, hang_after: int = -1) -> None:
            procs.spawn(
                name,
                [
                    sys.executable,
                    "-m",
                    "kmq.dev.demo_worker",
                    *common,
                    "--queue",
                    queue_id,
                    "--name",
                    name,
                    "--redelivery-timeout-s",
                    str(redelivery_timeout_s),
                    "--session-timeout-ms",
                    str(session_ms),
                    "--hang-after",
                    str(hang_after),
                ],
            )

        worker("emails-1", "emails", hang_after=2)
        worker("invoices-1", "invoices")
        worker("thumbnails-1", "thumbnails")

        acked: Counter[str] = Counter()
        deadline = time.monotonic() + timeout_s
        while set(acked) != set(sent) and time.monotonic() < deadline:
            try:
                name, line = procs.lines.get(timeout=0.5)
            except queue_mod.Empty:
                continue
            if name == "tracker":
                if ": redelivered " in line:
                    summary.redelivered += 1
                    say(f"tracker    | {line.split(': ', 1)[-1]}")
                elif "ERROR" in line or "Traceback" in line:
                    say(f"tracker    | {line}")
                continue
            try:
                event = json.loads(line)
            except ValueError:
                say(f"{name:<10} | {line}")
                continue
            kind = event.get("event")
            if kind == "took":
                summary.deliveries += 1
                if event["attempt"] > 1:
                    say(f"{name:<10} | took {event['id']} again, attempt {event['attempt']}")
            elif kind == "acked":
                acked[event["id"]] += 1
            elif kind == "holding":
                victim = procs.procs[name]
                say(f"{name:<10} | holding {event['id']} ... SIGKILL (pid {victim.pid})")
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                summary.killed += 1
                say(
                    f"{'':<10} | worker killed mid-message; its lease runs out in "
                    f"{redelivery_timeout_s:g} s and the tracker redelivers it"
                )
                worker("emails-2", "emails")
        summary.acked = len(acked)
        summary.duplicates = sum(n - 1 for n in acked.values())
        summary.missing = sorted(set(sent) - set(acked))
    return summary
