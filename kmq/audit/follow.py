"""``kmq audit --follow``: a Structured Streaming job over the queue, retry and markers topics.

One streaming query reads the three topics (``readStream.format("kmq")``), and each
micro-batch (``foreachBatch``) has Spark decode the records and compact the markers per
delivery; the driver merges that into a :class:`~kmq.audit.follow_state.FollowState`,
which it saves beside Spark's checkpoint with the batch id (a batch re-run after a restart
is applied once). Between batches the outputs are refreshed on a timer, so a message that
gets stuck while nothing is written is still flagged.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kmq.audit.follow_output import (
    SCHEMA,
    iso,
    render_html,
    render_prometheus,
    write_atomically,
)
from kmq.audit.follow_state import FollowLimits, FollowState
from kmq.config import retry_topic_for
from kmq.errors import BrokerError, KmqError
from kmq.markers import KNOWN_TYPES, MarkerType
from kmq.spark.columns import marker_type_name
from kmq.spark.kafka_io import partition_bounds
from kmq.spark.options import kafka_settings
from kmq.spark.schemas import MARKERS_SCHEMA, QUEUE_SCHEMA

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
STATE_FILE = "follow-state.json"

_RECORD_COLUMNS = ("partition", "offset", "timestamp", "queue", "message_id", "attempt")
_MARKER_COLUMNS = ("marker_offset", "timestamp", "type_id", "lane", "queue", "partition",
                   "offset", "message_id", "attempt", "redeliver_after_ms", "error")  # fmt: skip
_SETTLING = [int(t) for t in (MarkerType.END, MarkerType.NACK, MarkerType.RELEASE,
             MarkerType.REJECT, MarkerType.REDELIVERED, MarkerType.DEAD_LETTERED)]  # fmt: skip
_UNKNOWN_VERSION = "unsupported marker version"


class FollowError(KmqError):
    """The streaming query failed."""


@dataclass(frozen=True)
class FollowConfig:
    """What ``kmq audit --follow`` watches, when it flags, and where it writes."""

    bootstrap_servers: str
    output: Path
    checkpoint: Path | None = None
    """Spark's checkpoint and the follow state (default ``<output>/checkpoint``)."""
    queue_topic: str = "kmq.queue"
    marker_topic: str = "kmq.markers"
    retry_topic: str = ""
    queues: tuple[str, ...] = ()
    """Report only these queues (all when empty)."""
    trigger_s: float = 5.0
    stuck_leases: float = 3.0
    pending_bound_s: float = 60.0
    window_s: float = 300.0
    settled_horizon_s: float = 60.0
    orphan_after_s: float = 120.0
    max_records_per_trigger: int | None = 200_000
    html: bool = True
    prometheus: Path | None = None
    """Also write Prometheus metrics (text format) to this file."""
    max_restarts: int = 5
    """Failures of the streaming query in a row (no batch completed in between) that are
    met by starting it again from its checkpoint; one more stops the follow job."""
    kafka: Mapping[str, str] = field(default_factory=dict)

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint or self.output / "checkpoint"

    def limits(self) -> FollowLimits:
        return FollowLimits(
            stuck_leases=self.stuck_leases,
            pending_bound_ms=round(self.pending_bound_s * 1000),
            window_ms=round(self.window_s * 1000),
            settled_horizon_ms=round(self.settled_horizon_s * 1000),
            orphan_after_ms=round(self.orphan_after_s * 1000),
        )


def _source(
    spark: SparkSession, config: FollowConfig, kind: str, topic: str, columns: tuple[str, ...]
) -> DataFrame:
    full = QUEUE_SCHEMA if kind == "queue" else MARKERS_SCHEMA
    reader = (
        spark.readStream.format("kmq")
        .schema(type(full)([f for f in full.fields if f.name in columns]))
        .option("kind", kind)
        .option("bootstrap_servers", config.bootstrap_servers)
        .option("topic", topic)
        .option("starting_offsets", "earliest")
    )
    if config.max_records_per_trigger:
        reader = reader.option("max_records_per_trigger", str(config.max_records_per_trigger))
    for key, value in config.kafka.items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()


def event_stream(spark: SparkSession, config: FollowConfig) -> DataFrame:
    """One stream of the three topics: ``src`` is ``m`` (a marker) or ``q`` (a record)."""
    settings = kafka_settings({f"kafka.{k}": v for k, v in config.kafka.items()})
    markers = _source(spark, config, "markers", config.marker_topic, _MARKER_COLUMNS)
    out = markers.select(F.lit("m").alias("src"), *_MARKER_COLUMNS)
    lanes = [(0, config.queue_topic)]
    retry = config.retry_topic or retry_topic_for(config.queue_topic)
    try:
        partition_bounds(config.bootstrap_servers, retry, settings)
        lanes.append((1, retry))
    except BrokerError:  # no retry topic (kmq 0.1): copies are on the queue topic
        pass
    for lane, topic in lanes:
        records = _source(spark, config, "queue", topic, _RECORD_COLUMNS)
        out = out.unionByName(
            records.select(F.lit("q").alias("src"), F.lit(lane).alias("lane"), *_RECORD_COLUMNS),
            allowMissingColumns=True,
        )
    return out


def compact_markers(markers: DataFrame) -> DataFrame:
    """One row per delivery ``(lane, partition, offset)`` with this batch's valid markers."""
    m = markers.where(
        F.col("error").isNull()
        & F.col("type_id").isNotNull()
        & ~F.col("type_id").isin(int(MarkerType.PROBE), int(MarkerType.WATCH))
    ).select(
        F.coalesce("lane", F.lit(0)).alias("lane"),
        "partition",
        "offset",
        "type_id",
        "redeliver_after_ms",
        F.col("queue").alias("m_queue"),
        F.col("message_id").alias("m_message_id"),
        F.col("attempt").alias("m_attempt"),
        F.col("marker_offset").alias("pos"),
        F.unix_millis("timestamp").alias("ts"),
    )

    def of(*types: MarkerType) -> Any:
        return F.col("type_id").isin(*[int(t) for t in types])

    start, settling = of(MarkerType.START), F.col("type_id").isin(*_SETTLING)
    return m.groupBy("lane", "partition", "offset").agg(
        F.max("m_queue").alias("m_queue"),
        F.max("m_message_id").alias("m_message_id"),
        F.max(F.when(start, F.col("m_attempt"))).alias("m_attempt"),
        F.count(F.when(start, 1)).alias("starts"),
        F.min(F.when(start, F.col("ts"))).alias("first_start_ms"),
        F.max(F.when(start, F.col("pos"))).alias("last_start_pos"),
        F.max_by(F.col("ts"), F.when(start, F.col("pos"))).alias("last_start_ms"),
        F.max(F.when(of(MarkerType.START, MarkerType.KEEPALIVE), F.col("redeliver_after_ms")))
        .alias("lease_ms"),
        F.min(F.when(of(MarkerType.END), F.col("ts"))).alias("end_ms"),
        F.max(F.when(settling, F.col("pos"))).alias("last_settle_pos"),
        F.max_by(F.col("type_id"), F.when(settling, F.col("pos"))).alias("last_settle_type"),
        F.min(F.when(of(MarkerType.REDELIVERED), F.col("ts"))).alias("redelivered_ms"),
        (F.count(F.when(of(MarkerType.DEAD_LETTERED), 1)) > 0).alias("dead_lettered"),
        F.min("ts").alias("first_ms"),
        F.max("ts").alias("last_ms"),
    )  # fmt: skip


def marker_kinds(markers: DataFrame) -> DataFrame:
    """``(type_id, problem, markers)``: problem 0 valid, 1 undecodable, 2 unknown version."""
    problem = (
        F.when(F.col("error").isNull(), 0)
        .when(F.col("error").startswith(_UNKNOWN_VERSION), 2)
        .otherwise(1)
    )
    return markers.groupBy(
        F.when(F.col("error").isNull(), F.col("type_id")).alias("type_id"), problem.alias("problem")
    ).agg(F.count(F.lit(1)).alias("markers"))


def _counts(rows: list[Any]) -> tuple[dict[str, int], dict[str, int]]:
    markers: dict[str, int] = {}
    bad: dict[str, int] = {}
    for r in rows:
        n = int(r["markers"])
        if r["problem"]:
            markers["INVALID"] = markers.get("INVALID", 0) + n
            kind = "unknown_version" if r["problem"] == 2 else "undecodable"
            bad[kind] = bad.get(kind, 0) + n
        else:
            type_id = int(r["type_id"])
            known = type_id in KNOWN_TYPES
            name = marker_type_name(type_id)
            markers[name] = markers.get(name, 0) + n
            if not known:
                bad["unknown_type"] = bad.get("unknown_type", 0) + n
    return markers, bad


class Follower:
    """Applies micro-batches to the state and writes the outputs (thread-safe)."""

    def __init__(self, config: FollowConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        self.lock = threading.Lock()
        self.state_path = config.checkpoint_dir / STATE_FILE
        self.state = FollowState(limits=config.limits())
        if self.state_path.exists():
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
            self.state = FollowState.from_json(data, config.limits())
        self.last_write = 0.0
        self.summary: dict[str, Any] = {}

    def on_batch(self, batch: DataFrame, batch_id: int) -> None:
        if batch_id <= self.state.batch_id:  # re-run after a restart: applied already
            return
        started = time.monotonic()
        batch = batch.persist()
        try:
            markers = batch.where(F.col("src") == "m")
            kinds = marker_kinds(markers).collect()
            compacted = [r.asDict() for r in compact_markers(markers).collect()]
            records = [
                r.asDict()
                for r in batch.where(F.col("src") == "q")
                .select("lane", "partition", "offset", "queue", "message_id", "attempt",
                        F.unix_millis("timestamp").alias("sent_ms"))
                .collect()
            ]  # fmt: skip
        finally:
            batch.unpersist()
        marker_counts, bad = _counts(kinds)
        with self.lock:
            self.state.apply(batch_id, records, compacted, marker_counts, bad)
            self.state.evict(int(time.time() * 1000))
            self.config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(self.state_path, json.dumps(self.state.to_json()))
            self._write(batch_seconds=time.monotonic() - started)

    def refresh(self) -> None:
        """Re-judge the state as of now (no batch needed) when the outputs are due."""
        with self.lock:
            if time.monotonic() - self.last_write >= self.config.trigger_s:
                self.state.evict(int(time.time() * 1000))
                self._write(batch_seconds=None)

    def _write(self, batch_seconds: float | None) -> None:
        c = self.config
        now_ms = int(time.time() * 1000)
        view = self.state.view(now_ms)
        if c.queues:
            keep = set(c.queues)
            view["current"] = {q: v for q, v in view["current"].items() if q in keep}
            view["window"] = {q: v for q, v in view["window"].items() if q in keep}
            view["stuck"] = [s for s in view["stuck"] if s["queue"] in keep]
        overall: dict[str, int] = {}
        for counts in view["current"].values():
            for k, v in counts.items():
                overall[k] = overall.get(k, 0) + v
        summary: dict[str, Any] = {
            "schema": SCHEMA,
            "as_of": iso(now_ms),
            "as_of_ms": now_ms,
            "batch_id": self.state.batch_id,
            "batch_s": None if batch_seconds is None else round(batch_seconds, 3),
            "topics": {"queue": c.queue_topic, "markers": c.marker_topic},
            "window_s": c.window_s,
            "limits": asdict(c.limits()),
            "overall": overall,
            **view,
            "markers": dict(sorted(self.state.markers.items())),
            "bad_input": dict(sorted(self.state.bad_input.items())),
            "state": self.state.size(),
        }
        c.output.mkdir(parents=True, exist_ok=True)
        # summary.json last: once it shows a refresh, the report and the metrics show it too.
        if c.prometheus is not None:
            write_atomically(c.prometheus, render_prometheus(summary))
        if c.html:
            write_atomically(c.output / REPORT_FILE, render_html(summary, c.trigger_s))
        write_atomically(c.output / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
        self.summary = summary
        self.last_write = time.monotonic()


def run_follow(
    spark: SparkSession,
    config: FollowConfig,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
) -> None:
    """Run until ``stop`` is set, refreshing the outputs every trigger. A query that fails is
    started again from its checkpoint (nothing is counted twice: a batch already applied is
    skipped), after 1, 2, 4... s; :class:`FollowError` after ``config.max_restarts``
    failures in a row without a batch completing in between."""
    stop = stop or threading.Event()
    follower = Follower(config, say)
    failures = 0
    while True:
        applied = follower.state.batch_id
        query = _start_query(spark, config, follower)
        say(f"following {config.queue_topic} and {config.marker_topic}; writing {config.output}")
        try:
            failure = _watch(query, follower, stop, config.trigger_s)
        finally:
            query.stop()
        if failure is None:
            return
        failures = 1 if follower.state.batch_id != applied else failures + 1
        if failures > config.max_restarts:
            raise FollowError(f"the streaming query stopped: {failure}")
        backoff_s = min(30.0, 2.0 ** (failures - 1))
        say(f"the streaming query stopped ({failure}); starting it again from its checkpoint "
            f"in {backoff_s:g} s ({failures} of {config.max_restarts} in a row)")  # fmt: skip
        if stop.wait(backoff_s):
            return


def _start_query(spark: SparkSession, config: FollowConfig, follower: Follower) -> Any:
    return (
        event_stream(spark, config)
        .writeStream.foreachBatch(follower.on_batch)
        .option("checkpointLocation", str(config.checkpoint_dir / "spark"))
        .trigger(processingTime=f"{config.trigger_s} seconds")
        .queryName(f"kmq-audit-follow-{config.marker_topic}")
        .start()
    )


def _watch(query: Any, follower: Follower, stop: threading.Event, trigger_s: float) -> str | None:
    """Refresh the outputs until ``stop`` (None) or the query stops (why, as text)."""
    while not stop.wait(min(1.0, trigger_s)):
        failure = query.exception()
        if failure is not None or not query.isActive:
            return str(failure) if failure is not None else "it is no longer active"
        follower.refresh()
    return None
