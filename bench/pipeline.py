"""One end-to-end run: producer process -> broker -> consumer process (+ tracker process).

Raw: kafka-python producer -> one topic per logical queue -> one consumer group per topic,
committing after every polled batch. kmq: kmq.Producer -> the queue topic -> one kmq
consumer per logical queue acking every message, with a tracker process running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    JSON,
    Child,
    Children,
    Context,
    cpu_s,
    create_topics,
    delete_topics,
    new_tag,
    rss_kb,
    summarize,
)
from kmq.config import ServiceConfig
from kmq.topics import ensure_topics

PARTITIONS = 4
MAX_IN_FLIGHT = 500
"""kmq consumers' max_in_flight, matched by the raw consumers' max_records per poll."""


@dataclass(frozen=True)
class Run:
    side: str  # "raw" or "kmq"
    queues: int
    count: int
    rate: float = 0.0
    """Offered load in messages/s; 0 sends as fast as the producer can."""
    lease_s: float = 30.0
    drop_pct: int = 0
    ack_wait: bool = False
    latency: bool = False
    """Measure send->receive (and, for kmq, receive->END visible at the tracker)."""
    warmup: int = 0
    """Messages per queue left out of latency figures."""
    profile: str | None = None
    """File stem for py-spy profiles of the consumer (and tracker) processes."""
    consumer_options: tuple[tuple[str, Any], ...] = ()
    """Extra kmq.ConsumerConfig settings, e.g. (("transactional", True),)."""
    payload_bytes: int = 100
    batch_ack: bool = False
    """kmq: one thread per queue calls receive_many(100), then a durable ack_many()."""
    nack_pct: int = 0
    """kmq: nack this share of first deliveries with no delay (their copies are timed)."""
    work_ms: float = 0.0
    """kmq: the application's work per message (a consumer slower than the producer)."""
    measure_bytes: bool = False
    """Read every topic back afterwards and size what was written (bench/bytes.py)."""
    placed: bool = True
    """kmq: declare the queues when creating the topic, so their windows do not overlap;
    False places them by their ids' hash (several groups then share partitions)."""

    @property
    def label(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.consumer_options)
        if self.batch_ack:
            extra += " receive_many+ack_many"
        if self.payload_bytes != 100:
            extra += f" payload={self.payload_bytes}B"
        return (
            f"{self.side} q={self.queues} n={self.count}"
            + (f" rate={self.rate:.0f}/s" if self.rate else "")
            + extra
        )


def _timeout_s(run: Run) -> float:
    if run.rate:
        return 90 + run.count / run.rate * 2
    return 90 + run.count / 150


def _start_tracker(children: Children, ctx: Context, run: Run, topics: JSON) -> Child:
    if run.latency:
        return children.worker(
            "tracker-probe",
            "tracker-probe",
            {
                "bootstrap_servers": ctx.bootstrap_servers,
                "queue_topic": topics["queue"],
                "marker_topic": topics["markers"],
                "control_topic": topics["control"],
                "group_id": f"bench-tracker-{topics['markers']}",
                "session_timeout_ms": ctx.session_timeout_ms,
                "lease_s": run.lease_s,
                "samples_path": str(topics["tracker_samples"]),
            },
        )
    return children.python(
        "tracker",
        "-m", "tracker",
        "--bootstrap-servers", ctx.bootstrap_servers,
        "--queue-topic", topics["queue"],
        "--marker-topic", topics["markers"],
        "--control-topic", topics["control"],
        "--group-id", f"bench-tracker-{topics['markers']}",
        "--default-redelivery-timeout-s", str(run.lease_s),
        "--session-timeout-ms", str(ctx.session_timeout_ms),
        "--stats-interval-s", "3600",
    )  # fmt: skip


def _py_spy(children: Children, target: Child, out: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return None
    argv = [exe, "record", "--pid", str(target.pid), "--rate", "500", "--format", "raw"]
    # --gil: only samples of the thread holding the GIL, i.e. Python code on a CPU, not
    # threads waiting for it (those would show up as the lock call that let another run).
    argv += ["--threads", "--nonblocking", "--gil", "-o", str(out)]
    log = open(children.ctx.work_dir / f"py-spy-{out.stem}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    return proc


def _stop_py_spy(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    try:
        proc.wait(timeout=30)  # it writes its output and exits when the target exits
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def run_pipeline(ctx: Context, run: Run) -> JSON:
    tag = new_tag()
    topics: JSON = {}
    names: list[str]
    queues = [f"q{i}" for i in range(run.queues)]
    if run.side == "raw":
        names = [f"bench.{tag}.raw{i}" for i in range(run.queues)]
        create_topics(ctx.bootstrap_servers, dict.fromkeys(names, PARTITIONS))
        topics["raw"] = names
    else:
        topics["queue"] = f"bench.{tag}.queue"
        topics["markers"] = f"bench.{tag}.markers"
        topics["tracker_samples"] = ctx.work_dir / f"{tag}-tracker-ends.json"
        topics["consumer_samples"] = ctx.work_dir / f"{tag}-consumer-recv.json"
        names = [topics["queue"], topics["markers"]]
        topics["control"] = f"bench.{tag}.control"
        names += [topics["control"], f"{topics['queue']}.retry"]
        ensure_topics(
            ServiceConfig(
                bootstrap_servers=ctx.bootstrap_servers,
                queue_topic=topics["queue"],
                marker_topic=topics["markers"],
                control_topic=topics["control"],
                # As many partitions per queue as raw gives each queue's topic.
                queue_partitions=PARTITIONS * run.queues,
                queue_spread=PARTITIONS,
                marker_partitions=PARTITIONS,
                # Declared, as raw's topics are: each queue on partitions of its own.
                queues=tuple(queues) if run.placed else (),
            )
        )
    count = run.count - run.count % run.queues
    timeout_s = _timeout_s(run)
    common: JSON = {
        "bootstrap_servers": ctx.bootstrap_servers,
        "session_timeout_ms": ctx.session_timeout_ms,
        "count": count,
        "timeout_s": timeout_s,
        "latency": run.latency,
        "warmup": run.warmup,
        "size": run.payload_bytes,
    }
    if run.side == "raw":
        consumer_args = {**common, "topics": names, "group_prefix": f"bench.{tag}"}
        consumer_args["max_records"] = MAX_IN_FLIGHT
        producer_args = {
            **common,
            "side": "raw",
            "topics": names,
            "partitions": PARTITIONS,
        }
    else:
        kmq_topics = {
            "queue_topic": topics["queue"],
            "marker_topic": topics["markers"],
            "control_topic": topics["control"],
        }
        consumer_args = {
            **common,
            **kmq_topics,
            "queues": queues,
            "max_in_flight": MAX_IN_FLIGHT,
            "lease_s": run.lease_s,
            "ack_wait": run.ack_wait,
            "batch_ack": run.batch_ack,
            "drop_pct": run.drop_pct,
            "nack_pct": run.nack_pct,
            "work_ms": run.work_ms,
            "record_ids": run.latency,
            "samples_path": str(topics["consumer_samples"]),
            "consumer_options": dict(run.consumer_options),
        }
        producer_args = {**common, **kmq_topics, "side": "kmq", "queues": queues}
    producer_args["rate"] = run.rate
    if run.profile:
        producer_args["start_delay_s"] = 1.0
    result: JSON = {
        "run": {
            **run.__dict__,
            "count": count,
            "consumer_options": dict(run.consumer_options),
        }
    }
    spies: list[subprocess.Popen[bytes] | None] = []
    try:
        with Children(ctx) as children:
            tracker = _start_tracker(children, ctx, run, topics) if run.side == "kmq" else None
            consumer = children.worker(f"consume-{run.side}", f"consume-{run.side}", consumer_args)
            consumer.wait_event("ready", 90)
            if tracker is not None:
                if run.latency:
                    tracker.wait_event("ready", 90)
                else:
                    tracker.wait_line("caught up", 90)
            cpu0 = {"tracker": cpu_s(tracker.pid) if tracker is not None else 0.0}
            if ctx.broker_pid is not None:
                cpu0["broker"] = cpu_s(ctx.broker_pid)
            if run.profile:
                spies.append(_py_spy(children, consumer, ctx.work_dir / f"{run.profile}.txt"))
                if tracker is not None:
                    out = ctx.work_dir / f"{run.profile}-tracker.txt"
                    spies.append(_py_spy(children, tracker, out))
            producer = children.worker(f"produce-{run.side}", "produce", producer_args)
            if run.profile:
                producer.wait_event("ready", 90)  # it waits start_delay_s for py-spy
                spies.append(
                    _py_spy(children, producer, ctx.work_dir / f"{run.profile}-producer.txt")
                )
            produced = producer.wait_event("result", timeout_s)
            consumed = consumer.wait_event("result", timeout_s)
            if consumed["errors"]:
                raise RuntimeError(f"{run.label}: consumer errors {consumed['errors']}")
            cpu = {"producer": produced["cpu_s"], "consumer": consumed["cpu_s"]}
            if ctx.broker_pid is not None:
                cpu["broker"] = cpu_s(ctx.broker_pid) - cpu0["broker"]
            if tracker is not None:
                cpu["tracker"] = cpu_s(tracker.pid) - cpu0["tracker"]
                with contextlib.suppress(OSError):
                    result["tracker_rss_kb"] = rss_kb(tracker.pid)
                tracker.terminate()
                if run.latency:
                    result["tracker"] = tracker.wait_event("result", 30)
                else:
                    stopped = [line for line in tracker.lines if "stopped:" in line]
                    result["tracker"] = {"stopped": stopped[-1] if stopped else None}
            for spy in spies:
                _stop_py_spy(spy)
            consumer.terminate()
            producer.terminate()
        if run.measure_bytes:
            from bench.bytes import topic_bytes

            written = topic_bytes(ctx.bootstrap_servers, [n for n in names if "control" not in n])
            total = sum(t["bytes"] for t in written.values())
            result["bytes_written"] = {
                "topics": written,
                "per_message": total / count,
                "overhead_per_message": total / count - run.payload_bytes,
            }
    finally:
        delete_topics(ctx.bootstrap_servers, names)
    elapsed = consumed["done"] - produced["first_send"]
    result.update(
        produced=produced,
        consumed=consumed,
        seconds=elapsed,
        acked_per_s=consumed["acked"] / elapsed,
        produce_per_s=count / (produced["flushed"] - produced["first_send"]),
        cpu_us_per_msg={k: v / max(1, consumed["acked"]) * 1e6 for k, v in cpu.items()},
    )
    if consumed["acked"] < count:
        result["incomplete"] = f"only {consumed['acked']} of {count} acked before the timeout"
    if run.side == "kmq" and run.latency:
        recv_at = json.loads(Path(topics["consumer_samples"]).read_text())
        seen = json.loads(Path(topics["tracker_samples"]).read_text())
        visible = [(seen[i] - t) * 1000 for i, t in recv_at.items() if i in seen]
        result["recv_to_end_visible_ms"] = summarize(visible)
        result["recv_to_end_visible_ms"]["unmatched"] = len(recv_at) - len(visible)
    if run.profile:
        result["profiles"] = [
            str(p)
            for p in (
                ctx.work_dir / f"{run.profile}.txt",
                ctx.work_dir / f"{run.profile}-tracker.txt",
                ctx.work_dir / f"{run.profile}-producer.txt",
            )
            if p.exists()
        ]
    return result
