"""The ``kmq audit`` job: snapshot both topics, run the transforms, write the results.

Only this module (and the DataSource it reads through) does I/O.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kmq.audit import transforms as T
from kmq.audit.progress import Progress
from kmq.audit.summary import build_summary, choose_bucket_ms
from kmq.config import retry_topic_for
from kmq.errors import BrokerError
from kmq.markers import QUEUE_LANE, RETRY_LANE
from kmq.spark.columns import marker_type_name
from kmq.spark.kafka_io import partition_bounds
from kmq.spark.options import kafka_settings
from kmq.spark.schemas import MARKERS_SCHEMA, QUEUE_SCHEMA

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"


@dataclass(frozen=True)
class AuditConfig:
    """What to audit and where the results go."""

    bootstrap_servers: str
    output: Path
    queue_topic: str = "kmq.queue"
    marker_topic: str = "kmq.markers"
    retry_topic: str = ""
    """Where the tracker writes redelivered copies (default ``<queue_topic>.retry``)."""
    queues: tuple[str, ...] = ()
    """Only these logical queues (all when empty)."""
    max_records_per_split: int = 1_000_000
    """Offsets per Spark task: each task costs a Python worker's setup and a Kafka
    connection, so a partition becomes several tasks only when it is large."""
    samples: int = 20
    """How many of the oldest unsettled messages of each status the summary lists."""
    top_reasons: int = 20
    html: bool = True
    kafka: Mapping[str, str] = field(default_factory=dict)
    """kafka-python settings for every client (security settings, say)."""


def _read(
    spark: SparkSession,
    config: AuditConfig,
    kind: str,
    topic: str,
    bounds: Mapping[int, tuple[int, int]],
    columns: tuple[str, ...],
) -> DataFrame:
    full = QUEUE_SCHEMA if kind == "queue" else MARKERS_SCHEMA
    schema = type(full)([f for f in full.fields if f.name in columns])
    reader = (
        spark.read.format("kmq")
        .schema(schema)
        .option("kind", kind)
        .option("bootstrap_servers", config.bootstrap_servers)
        .option("topic", topic)
        .option("max_records_per_split", str(config.max_records_per_split))
        .option("start_offsets", json.dumps({str(p): lo for p, (lo, _) in bounds.items()}))
        .option("end_offsets", json.dumps({str(p): hi for p, (_, hi) in bounds.items()}))
    )
    for key, value in config.kafka.items():
        reader = reader.option(f"kafka.{key}", value)
    df = reader.load()
    if config.queues and kind == "queue":
        # Markers (version 2) name no queue: the join with these records picks theirs.
        df = df.where(F.col("queue").isin(*config.queues))
    return df


def _type_name(type_id: int) -> str:
    return "INVALID" if type_id == T.INVALID else marker_type_name(type_id)


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in df.collect()]


def _breakdowns(
    attempts: DataFrame, causes: DataFrame, reasons: DataFrame
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Collect three small aggregates with one Spark job."""
    parts = [(attempts, "attempts", "messages"), (causes, "cause", "redeliveries"),
             (reasons, "reason", "redeliveries")]  # fmt: skip
    union = None
    for i, (df, key, count) in enumerate(parts):
        part = df.select(
            F.lit(i).alias("part"),
            F.col(key).cast("string").alias("key"),
            "queue",
            F.col(count).alias("n"),
        )
        union = part if union is None else union.unionByName(part)
    assert union is not None
    out: tuple[list[dict[str, Any]], ...] = ([], [], [])
    for row in _rows(union):
        _, key, count = parts[row["part"]]
        value: Any = int(row["key"]) if key == "attempts" else row["key"]
        out[row["part"]].append({key: value, "queue": row["queue"], count: row["n"]})
    return out[0], out[1], out[2]


def _samples(messages: DataFrame, dlqs: list[str], limit: int) -> dict[str, list[dict[str, Any]]]:
    """The oldest ``limit`` messages of each unsettled status, with one Spark job."""
    statuses = [s for s in T.STATUSES if s != "acked"]
    union = None
    for status in statuses:
        part = T.problems(messages, status, dlqs).limit(limit).withColumn("status", F.lit(status))
        union = part if union is None else union.unionByName(part)
    assert union is not None
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in statuses}
    for row in _rows(union) if limit else []:
        out[row.pop("status")].append(row)
    for rows in out.values():
        rows.sort(key=lambda r: (r["since_ms"], r["queue"], r["message_id"]))
    return out


def bad_input(summary: Mapping[str, Any], unknown_version: int) -> dict[str, int]:
    """What the audit skipped, named as ``kmq audit --follow`` names it: ``undecodable``
    records, markers of an ``unknown_version`` or ``unknown_type``, and ``orphans``."""
    markers = summary["markers"]
    return {
        "undecodable": markers.get("INVALID", 0) - unknown_version,
        "unknown_version": unknown_version,
        "unknown_type": sum(n for t, n in markers.items() if t.startswith("UNKNOWN_")),
        "orphans": sum(q["orphans"] for q in summary["queues"].values()),
    }


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_audit(
    spark: SparkSession, config: AuditConfig, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Audit the topics as they are now; write summary.json (and report.html) to
    ``config.output`` and return the summary."""
    started = time.monotonic()
    settings = kafka_settings({f"kafka.{k}": v for k, v in config.kafka.items()})
    keep = StorageLevel.MEMORY_AND_DISK_DESER
    with Progress(spark.sparkContext, say, total_steps=7 if config.html else 6) as progress:
        with progress.step("snapshot the high watermarks", "snapshot"):
            # Markers first: every START and REDELIVERED in this snapshot then names a queue
            # record that is in the queue snapshot taken after it.
            marker_bounds = partition_bounds(
                config.bootstrap_servers, config.marker_topic, settings
            )
            queue_bounds = partition_bounds(config.bootstrap_servers, config.queue_topic, settings)
            retry_topic = config.retry_topic or retry_topic_for(config.queue_topic)
            try:
                retry_bounds = partition_bounds(config.bootstrap_servers, retry_topic, settings)
            except BrokerError:  # no retry topic (kmq 0.1): copies are on the queue topic
                retry_bounds = {}
            as_of_ms = int(time.time() * 1000)
        say(
            f"      {sum(hi - lo for lo, hi in queue_bounds.values()):,} queue records, "
            f"{sum(hi - lo for lo, hi in marker_bounds.values()):,} markers to read"
        )
        markers = _read(
            spark, config, "markers", config.marker_topic, marker_bounds, T.MARKER_COLUMNS
        ).persist(keep)
        records = T.queue_records(
            _read(spark, config, "queue", config.queue_topic, queue_bounds, T.RECORD_COLUMNS),
            QUEUE_LANE,
        )
        if retry_bounds:
            copies = _read(spark, config, "queue", retry_topic, retry_bounds, T.RECORD_COLUMNS)
            records = records.unionByName(T.queue_records(copies, RETRY_LANE))
        records = records.persist(keep)

        with progress.step("read the markers", "read_markers"):
            marker_types = [
                {"type": _type_name(r["type_id"]), "markers": r["markers"]}
                for r in _rows(T.marker_type_counts(markers))
            ]
            unknown_version = markers.where(
                F.col("error").startswith("unsupported marker version")
            ).count()
        with progress.step("read the queue records", "read_queue"):
            dlqs = sorted(r["queue"] for r in _rows(T.dead_letter_queues(records)))
        with progress.step("join each queue record with its markers", "deliveries"):
            deliveries = T.deliveries(records, markers)
            if config.queues:
                deliveries = deliveries.where(F.col("queue").isin(*config.queues))
            deliveries = deliveries.persist(keep)
            deliveries.count()
        markers.unpersist()
        records.unpersist()
        with progress.step("follow each message", "messages"):
            messages = T.messages(deliveries).persist(keep)
            messages.count()
        with progress.step("count, percentiles, histograms", "aggregates"):
            counts = _rows(T.queue_counts(messages, deliveries, as_of_ms))
            latency_bins = _rows(T.latency_bins(T.latency_values(deliveries, messages)))
            attempts, causes, reasons = _breakdowns(
                T.attempts_histogram(messages),
                T.redelivery_causes(deliveries),
                T.redelivery_reasons(deliveries, config.top_reasons),
            )
            kept = [r for r in counts if r["queue"] not in dlqs]
            first = min((r["first_sent_ms"] for r in kept if r["first_sent_ms"]), default=None)
            last = max(
                (t for r in kept for t in (r["last_event_ms"], r["last_redelivered_ms"]) if t),
                default=None,
            )
            bucket_ms = choose_bucket_ms(first, last)
            activity = _rows(T.activity(T.activity_events(deliveries, messages, dlqs), bucket_ms))
            samples = _samples(messages, dlqs, config.samples)
        deliveries.unpersist()
        messages.unpersist()
        records_read = sum(r["queue_records"] or 0 for r in counts)
        snapshot = {
            "as_of": dt.datetime.fromtimestamp(as_of_ms / 1000, dt.UTC).isoformat(
                timespec="seconds"
            ),
            "as_of_ms": as_of_ms,
            "bootstrap_servers": config.bootstrap_servers,
            "queue_topic": config.queue_topic,
            "marker_topic": config.marker_topic,
            "queues": list(config.queues) or None,
            "queue_offsets": {str(p): list(b) for p, b in sorted(queue_bounds.items())},
            "marker_offsets": {str(p): list(b) for p, b in sorted(marker_bounds.items())},
            "queue_records": records_read,
            "marker_records": sum(r["markers"] for r in marker_types),
        }
        summary = build_summary(
            snapshot=snapshot,
            dead_letter_queues=dlqs,
            counts=counts,
            latency_bins=latency_bins,
            attempts=attempts,
            causes=causes,
            reasons=reasons,
            marker_types=marker_types,
            activity=activity,
            bucket_ms=bucket_ms,
            samples=samples,
            top_reasons=config.top_reasons,
        )
        config.output.mkdir(parents=True, exist_ok=True)
        if config.html:
            with progress.step("render the report", "report"):
                from kmq.audit.report import render_html

                _write(config.output / REPORT_FILE, render_html(summary))
        summary["bad_input"] = bad_input(summary, unknown_version)
        summary["timing_s"] = {
            **{k: round(v, 3) for k, v in progress.timings.items()},
            "total": round(time.monotonic() - started, 3),
        }
        _write(config.output / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary
