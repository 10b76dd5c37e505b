"""Spark benchmark: DataSource read throughput against a plain kafka-python loop, and the
time of ``kmq audit`` for 100k and 1M messages with their markers.

    .venv/bin/python -m bench.spark_bench [--sizes 100000,1000000] [--read-size N]
    .venv/bin/python -m bench.spark_bench --serve 1000000      # load once, keep serving
    .venv/bin/python -m bench.spark_bench --bootstrap-servers HOST:PORT --sizes 1000000

Each size gets a fresh embedded broker loaded with a realistic mix (mostly acked at once;
nacked, expired, dead-lettered, in flight and pending ones too), or, with
--bootstrap-servers, the broker a --serve run loaded with that many messages. Each audit
records its wall time, the CPU seconds of the driver and everything it started (the JVM,
Spark's Python workers), the peak RSS of the driver's JVM and Python processes, the load
average, and (with --event-log) Spark's own time per job and stage. Prints Markdown tables
and writes bench/results/spark.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaProducer, TopicPartition

from kmq.config import ServiceConfig
from kmq.dev.embedded import EmbeddedBroker
from kmq.markers import Marker, MarkerType, encode, parse
from kmq.records import dead_letter_headers, parse_queue_headers, queue_headers
from kmq.spark.kafka_io import open_consumer, partition_bounds
from kmq.topics import ensure_topics

QUEUE_TOPIC, MARKER_TOPIC = "bench.queue", "bench.markers"
PARTITIONS = 4
QUEUES = ("orders", "emails", "thumbnails")
PAYLOAD = bytes(100)
SPAN_MS = 30 * 60_000
RESULTS = Path(__file__).parent / "results" / "spark.json"


@dataclass(frozen=True)
class Plan:
    """One message's fate. Offsets are known up front: fresh topics, one writer each."""

    i: int
    queue: str
    mid: str
    partition: int
    sent: int
    outcome: str  # acked, nacked, expired, dead, inflight, pending
    wait: int
    work: int


def plans(n: int, seed: int = 7) -> Iterator[Plan]:
    rng = random.Random(seed)
    t0 = int(time.time() * 1000) - SPAN_MS - 60_000
    for i in range(n):
        r = rng.random()
        outcome = (
            "pending"
            if r < 0.005
            else "inflight"
            if r < 0.01
            else "nacked"
            if r < 0.03
            else "expired"
            if r < 0.04
            else "dead"
            if r < 0.042
            else "acked"
        )
        yield Plan(
            i=i,
            queue=QUEUES[0 if r > 0.5 else 1 if r > 0.2 else 2],
            mid=f"{i:032x}",
            partition=i % PARTITIONS,
            sent=t0 + i * SPAN_MS // n,
            outcome=outcome,
            wait=int(rng.expovariate(1 / 200)),
            work=int(rng.lognormvariate(3.9, 0.6)),
        )


def _producer(bootstrap: str) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=50,
        batch_size=1 << 20,
    )


def _offsets(n: int) -> tuple[dict[int, int], dict[int, int]]:
    """(offset of each message's original, offset of each redelivered copy)."""
    next_offset = [0] * PARTITIONS
    original: dict[int, int] = {}
    for p in plans(n):
        original[p.i] = next_offset[p.partition]
        next_offset[p.partition] += 1
    copy: dict[int, int] = {}
    for p in plans(n):  # load_queue() writes copies and dead letters in this order
        if p.outcome in ("nacked", "expired"):
            copy[p.i] = next_offset[p.partition]
        if p.outcome in ("nacked", "expired", "dead"):
            next_offset[p.partition] += 1
    return original, copy


def load_queue(bootstrap: str, n: int) -> None:
    kp = _producer(bootstrap)
    for p in plans(n):
        kp.send(QUEUE_TOPIC, key=p.queue.encode(), value=PAYLOAD,
                headers=queue_headers(p.mid, 1, ()), partition=p.partition,
                timestamp_ms=p.sent)  # fmt: skip
    for p in plans(n):
        if p.outcome in ("nacked", "expired"):
            kp.send(QUEUE_TOPIC, key=p.queue.encode(), value=PAYLOAD,
                    headers=queue_headers(p.mid, 2, ()), partition=p.partition,
                    timestamp_ms=p.sent + 31_000)  # fmt: skip
        elif p.outcome == "dead":
            kp.send(QUEUE_TOPIC, key=f"{p.queue}.dlq".encode(), value=PAYLOAD,
                    headers=dead_letter_headers(p.mid, p.queue, 1, "rejected", ()),
                    partition=p.partition, timestamp_ms=p.sent + 1_000)  # fmt: skip
    kp.flush()
    kp.close()


def load_markers(bootstrap: str, n: int) -> None:
    original, copy = _offsets(n)
    kp = _producer(bootstrap)

    def send(p: Plan, kind: MarkerType, offset: int, attempt: int, t: int, **kw: Any) -> None:
        marker = Marker(kind, p.partition, offset, attempt, **kw)
        kp.send(MARKER_TOPIC, key=p.mid.encode(), value=encode(marker), timestamp_ms=t)

    for p in plans(n):
        if p.outcome == "pending":
            continue
        start = p.sent + p.wait
        lease = {"redeliver_after_ms": 30_000}
        send(p, MarkerType.START, original[p.i], 1, start, **lease)
        if p.outcome == "acked":
            send(p, MarkerType.END, original[p.i], 1, start + p.work)
        elif p.outcome == "dead":
            send(p, MarkerType.DEAD_LETTERED, original[p.i], 1, start + p.work,
                 reason="rejected", dead_letter_queue=f"{p.queue}.dlq")  # fmt: skip
        elif p.outcome in ("nacked", "expired"):
            redelivered = p.sent + 31_000
            if p.outcome == "nacked":
                send(p, MarkerType.NACK, original[p.i], 1, start + p.work, reason="bad input")
            reason = "bad input" if p.outcome == "nacked" else "lease expired"
            send(p, MarkerType.REDELIVERED, original[p.i], 2, redelivered, reason=reason)
            again = redelivered + p.wait
            send(p, MarkerType.START, copy[p.i], 2, again, **lease)
            send(p, MarkerType.END, copy[p.i], 2, again + p.work)
    kp.flush()
    kp.close()


def load(bootstrap: str, n: int) -> float:
    ensure_topics(
        ServiceConfig(
            bootstrap_servers=bootstrap,
            queue_topic=QUEUE_TOPIC,
            marker_topic=MARKER_TOPIC,
            queue_partitions=PARTITIONS,
            marker_partitions=PARTITIONS,
        )
    )
    started = time.monotonic()
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=load_queue, args=(bootstrap, n)),
        ctx.Process(target=load_markers, args=(bootstrap, n)),
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"loader failed with exit code {proc.exitcode}")
    return time.monotonic() - started


def baseline_read(bootstrap: str, topic: str, kind: str) -> tuple[int, float]:
    """A single kafka-python loop reading the whole topic, decoding what the DataSource
    decodes per row (kmq headers, or the marker: version 2, or version 1's protobuf)."""
    bounds = partition_bounds(bootstrap, topic)
    consumer = open_consumer(bootstrap, {})
    tps = [TopicPartition(topic, p) for p in bounds]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, bounds[tp.partition][0])
    remaining = {tp for tp in tps if bounds[tp.partition][1] > bounds[tp.partition][0]}
    rows = 0
    started = time.monotonic()
    while remaining:
        for tp, batch in consumer.poll(timeout_ms=200, max_records=50_000).items():
            for record in batch:
                if record.offset >= bounds[tp.partition][1]:
                    break
                rows += 1
                if kind == "queue":
                    parse_queue_headers(record.headers)
                else:
                    parse(record.value)
            if consumer.position(tp) >= bounds[tp.partition][1]:
                remaining.discard(tp)
                consumer.pause(tp)
    elapsed = time.monotonic() - started
    consumer.close()
    return rows, elapsed


def spark_read(spark: Any, bootstrap: str, topic: str, kind: str) -> tuple[int, float]:
    """The DataSource reading every column of every row (the noop sink materializes all)."""
    df = (
        spark.read.format("kmq")
        .option("kind", kind)
        .option("bootstrap_servers", bootstrap)
        .option("topic", topic)
        .load()
    )
    started = time.monotonic()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.monotonic() - started
    rows = sum(hi - lo for lo, hi in partition_bounds(bootstrap, topic).values())
    return rows, elapsed


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, with the children they reaped."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        ticks[int(name)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def _jvm_pid(spark: Any) -> int:
    pid: int = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    return pid


def audit(spark: Any, bootstrap: str, out: Path) -> dict[str, Any]:
    from kmq.audit.job import AuditConfig, run_audit

    config = AuditConfig(
        bootstrap_servers=bootstrap,
        output=out,
        queue_topic=QUEUE_TOPIC,
        marker_topic=MARKER_TOPIC,
    )
    jvm = _jvm_pid(spark)
    cpu_before = _tree_cpu_s(os.getpid())
    started = time.monotonic()
    summary = run_audit(spark, config, say=lambda line: print("   ", line, flush=True))
    summary["timing_s"]["wall"] = round(time.monotonic() - started, 3)
    summary["resources"] = {
        "cpu_s": round(_tree_cpu_s(os.getpid()) - cpu_before, 1),
        # High-water marks since each process started (one JVM for every size of a run).
        "driver_jvm_peak_rss_mb": _status_kb(jvm, "VmHWM") >> 10,
        "driver_python_peak_rss_mb": _status_kb(os.getpid(), "VmHWM") >> 10,
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="messages per audit run")
    parser.add_argument(
        "--read-size", type=int, default=None, help="compare reads at this size (default: largest)"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeats", type=int, default=2, help="read comparison: best of N")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--serve",
        type=int,
        metavar="N",
        help="load N messages into an embedded broker and keep serving them",
    )
    parser.add_argument(
        "--bootstrap-servers",
        help="a broker that --serve loaded with the (single) --sizes messages",
    )
    parser.add_argument("--event-log", type=Path,
                        help="write Spark's event log here and add each job's stages")  # fmt: skip
    parser.add_argument("--skip-read", action="store_true", help="no read comparison")
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve)
    sizes = [int(s) for s in args.sizes.split(",")]
    read_size = 0 if args.skip_read else args.read_size or max(sizes)
    if args.bootstrap_servers and len(sizes) != 1:
        parser.error("--bootstrap-servers takes one size: the one --serve loaded")

    from kmq.spark import get_session

    conf: dict[str, str] = {}
    if args.event_log:
        args.event_log.mkdir(parents=True, exist_ok=True)
        conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(args.event_log)}
    spark = get_session(args.master, app_name="kmq-spark-bench", conf=conf)
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": {
            "nproc": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "spark": spark.version,
            "master": spark.sparkContext.master,
            "broker": "embedded Tansu (same machine)",
        },
        "runs": [],
    }
    for n in sizes:
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            run: dict[str, Any] = {"messages": n}
            if args.bootstrap_servers:
                bs = args.bootstrap_servers
                run["load_s"] = None  # loaded by a --serve run
            else:
                bs = stack.enter_context(EmbeddedBroker()).bootstrap_servers
                print(f"== {n:,} messages: loading ...", flush=True)
                load_s = load(bs, n)
                run["load_s"] = round(load_s, 1)
                print(f"   loaded in {load_s:.1f} s", flush=True)
            run["loadavg_before"] = round(os.getloadavg()[0], 1)
            if n == read_size:
                run["read"] = {}
                for kind, topic in (("queue", QUEUE_TOPIC), ("markers", MARKER_TOPIC)):
                    # Interleaved, best of --repeats: the machine may be shared.
                    base_s = spark_s = float("inf")
                    for _ in range(args.repeats):
                        rows, took = baseline_read(bs, topic, kind)
                        base_s = min(base_s, took)
                        srows, took = spark_read(spark, bs, topic, kind)
                        spark_s = min(spark_s, took)
                    run["read"][kind] = {
                        "rows": rows,
                        "kafka_python_rows_per_s": round(rows / base_s),
                        "datasource_rows_per_s": round(srows / spark_s),
                        "ratio": round((srows / spark_s) / (rows / base_s), 2),
                        "kafka_python_s": round(base_s, 2),
                        "datasource_s": round(spark_s, 2),
                    }
                    print(f"   read {kind}: {run['read'][kind]}", flush=True)
            summary = audit(spark, bs, Path(tmp))
            overall = summary["overall"]
            run["audit"] = {
                "queue_records": summary["snapshot"]["queue_records"],
                "markers": summary["snapshot"]["marker_records"],
                "sent": overall["sent"],
                "acked": overall["acked"],
                "lost": overall["lost"],
                "seconds": summary["timing_s"],
                **summary["resources"],
            }
            run["loadavg_after"] = round(os.getloadavg()[0], 1)
            print(f"   audit: {run['audit']}", flush=True)
            results["runs"].append(run)
    spark.stop()
    if args.event_log:
        results["stages"] = stage_times(args.event_log)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    return 0


def serve(n: int) -> int:
    """Load ``n`` messages into an embedded broker and serve them until interrupted."""
    with EmbeddedBroker() as broker:
        print(f"bootstrap servers {broker.bootstrap_servers}", flush=True)
        print(f"loaded {n:,} messages in {load(broker.bootstrap_servers, n):.1f} s", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def stage_times(event_log: Path) -> list[dict[str, Any]]:
    """Each Spark job of the run's event log: when it started, how long it took, and its
    stages' wall time, task time, JVM CPU and GC time, and shuffle bytes."""
    logs = sorted(event_log.glob("*/events_*"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return []
    raw = logs[-1].read_bytes()
    if logs[-1].name.endswith(".zstd"):
        raw = subprocess.run(["zstd", "-dc"], input=raw, capture_output=True, check=True).stdout
    stages: dict[int, dict[str, Any]] = {}
    jobs: dict[int, dict[str, Any]] = {}
    for line in raw.decode().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            acc = {a["Name"]: a.get("Value") for a in info.get("Accumulables", [])}

            def metric(name: str, acc: dict[str, Any] = acc) -> int:
                return int(acc.get(f"internal.metrics.{name}") or 0)

            stages[info["Stage ID"]] = {
                "stage": info["Stage ID"],
                "name": info["Stage Name"].split(" at ")[0],
                "tasks": info["Number of Tasks"],
                "wall_s": round((info["Completion Time"] - info["Submission Time"]) / 1000, 2),
                "task_s": round(metric("executorRunTime") / 1000, 2),
                "jvm_cpu_s": round(metric("executorCpuTime") / 1e9, 2),
                "gc_s": round(metric("jvmGCTime") / 1000, 2),
                "shuffle_write_mb": round(metric("shuffle.write.bytesWritten") / 2**20, 1),
            }
        elif kind == "SparkListenerJobStart":
            jobs[event["Job ID"]] = {"t0": event["Submission Time"], "stages": event["Stage IDs"]}
        elif kind == "SparkListenerJobEnd":
            jobs[event["Job ID"]]["t1"] = event["Completion Time"]
    t0 = min((j["t0"] for j in jobs.values()), default=0)
    return [
        {
            "job": job,
            "start_s": round((j["t0"] - t0) / 1000, 2),
            "wall_s": round((j.get("t1", j["t0"]) - j["t0"]) / 1000, 2),
            "stages": [stages[s] for s in j["stages"] if s in stages],
        }
        for job, j in sorted(jobs.items())
    ]


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Spark {results['machine']['spark']}, master {results['machine']['master']}, "
        f"{results['machine']['nproc']} cores, {results['machine']['broker']}.",
        "",
        "| messages | queue records | markers | audit s | CPU s | driver JVM / Python peak "
        "RSS MB | load avg before/after |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in results["runs"]:
        a = run["audit"]
        lines.append(
            f"| {run['messages']:,} | {a['queue_records']:,} | {a['markers']:,} | "
            f"{a['seconds']['total']} | {a.get('cpu_s')} | {a.get('driver_jvm_peak_rss_mb')} / "
            f"{a.get('driver_python_peak_rss_mb')} | "
            f"{run['loadavg_before']} / {run['loadavg_after']} |"
        )
    for run in results["runs"]:
        if "read" not in run:
            continue
        lines += [
            "",
            f"Read throughput, {run['messages']:,} messages:",
            "",
            "| topic | rows | kafka-python loop rows/s | DataSource rows/s | ratio |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for kind, r in run["read"].items():
            lines.append(
                f"| {kind} | {r['rows']:,} | {r['kafka_python_rows_per_s']:,} | "
                f"{r['datasource_rows_per_s']:,} | {r['ratio']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
