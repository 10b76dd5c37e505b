"""Spark benchmark: DataSource read throughput against a plain kafka-python loop, and the
time of ``kmq audit`` for 100k and 1M messages with their markers.

    .venv/bin/python -m bench.spark_bench [--sizes 100000,1000000] [--read-size N]

Each size gets a fresh embedded broker loaded with a realistic mix (mostly acked at once;
nacked, expired, dead-lettered, in flight and pending ones too). Prints a Markdown table
and writes bench/results/spark.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
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


def audit(spark: Any, bootstrap: str, out: Path) -> dict[str, Any]:
    from kmq.audit.job import AuditConfig, run_audit

    config = AuditConfig(
        bootstrap_servers=bootstrap,
        output=out,
        queue_topic=QUEUE_TOPIC,
        marker_topic=MARKER_TOPIC,
    )
    started = time.monotonic()
    summary = run_audit(spark, config, say=lambda line: print("   ", line, flush=True))
    summary["timing_s"]["wall"] = round(time.monotonic() - started, 3)
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
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    read_size = args.read_size or max(sizes)

    from kmq.spark import get_session

    spark = get_session(args.master, app_name="kmq-spark-bench")
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
        with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
            bs = broker.bootstrap_servers
            print(f"== {n:,} messages: loading ...", flush=True)
            load_s = load(bs, n)
            run: dict[str, Any] = {"messages": n, "load_s": round(load_s, 1)}
            run["loadavg_before"] = round(os.getloadavg()[0], 1)
            print(f"   loaded in {load_s:.1f} s", flush=True)
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
            }
            run["loadavg_after"] = round(os.getloadavg()[0], 1)
            print(f"   audit: {run['audit']}", flush=True)
            results["runs"].append(run)
    spark.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    return 0


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Spark {results['machine']['spark']}, master {results['machine']['master']}, "
        f"{results['machine']['nproc']} cores, {results['machine']['broker']}.",
        "",
        "| messages | queue records | markers | load s | audit s (total) | load avg before/after |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in results["runs"]:
        a = run["audit"]
        lines.append(
            f"| {run['messages']:,} | {a['queue_records']:,} | {a['markers']:,} | "
            f"{run['load_s']} | {a['seconds']['total']} | "
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
