"""The audit's pure DataFrame transforms on small hand-made DataFrames (local Spark)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from kmq.audit import transforms as T
from kmq.markers import MarkerType
from kmq.spark import get_session
from kmq.spark.schemas import MARKERS_SCHEMA, QUEUE_SCHEMA

T0 = 1_700_000_000_000
LONG_AGO = T0 + 3_600_000  # "now" for overdue leases


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = get_session("local[2]", conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


def _schema(full: StructType, names: tuple[str, ...]) -> StructType:
    return StructType([f for f in full.fields if f.name in names])


def _ts(t: int) -> dt.datetime:
    return dt.datetime.fromtimestamp((T0 + t) / 1000, dt.UTC)


class Log:
    """Queue records and markers, written the way kmq writes them."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []
        self.markers: list[tuple[Any, ...]] = []
        self._next = {0: 0}

    def rec(self, queue: str, mid: str, attempt: int = 1, t: int = 0, dlq: bool = False) -> int:
        offset = self._next[0]
        self._next[0] += 1
        self.records.append((0, offset, _ts(t), queue, mid, attempt, "orders" if dlq else None))
        return offset

    def mk(self, kind: str, queue: str, offset: int | None, mid: str, attempt: int = 1, t: int = 0,
           lease: int = 30_000, reason: str = "", error: str | None = None) -> None:  # fmt: skip
        moff = len(self.markers)
        type_id = (
            int(kind.removeprefix("UNKNOWN_"))
            if kind.startswith("UNKNOWN_")
            else int(MarkerType[kind])
        )
        self.markers.append(
            (moff, _ts(t), type_id, 0, queue, 0, offset, mid, attempt, lease, reason, error)
        )

    def frames(self, spark: SparkSession) -> tuple[DataFrame, DataFrame]:
        records = spark.createDataFrame(self.records, _schema(QUEUE_SCHEMA, T.RECORD_COLUMNS))
        markers = spark.createDataFrame(self.markers, _schema(MARKERS_SCHEMA, T.MARKER_COLUMNS))
        return T.queue_records(records), markers


def _rules(log: Log) -> None:
    """One message per status rule, in queue "rules"; ids name the expected status."""
    a = log.rec("rules", "acked")
    log.mk("START", "rules", a, "acked")
    log.mk("END", "rules", a, "acked")
    f = log.rec("rules", "in_flight")
    log.mk("START", "rules", f, "in_flight")
    log.mk("KEEPALIVE", "rules", f, "in_flight")
    log.rec("rules", "pending")
    w = log.rec("rules", "awaiting_redelivery")
    log.mk("START", "rules", w, "awaiting_redelivery")
    log.mk("NACK", "rules", w, "awaiting_redelivery", reason="later")
    r = log.rec("rules", "awaiting_redelivery2")
    log.mk("START", "rules", r, "awaiting_redelivery2")
    log.mk("RELEASE", "rules", r, "awaiting_redelivery2")
    d = log.rec("rules", "dead_lettered")
    log.mk("START", "rules", d, "dead_lettered")
    log.mk("DEAD_LETTERED", "rules", d, "dead_lettered")
    lost = log.rec("rules", "lost")
    log.mk("START", "rules", lost, "lost")
    log.mk("REDELIVERED", "rules", lost, "lost", attempt=2)
    # acked on its first delivery, then delivered again: it stays acked
    x = log.rec("rules", "acked2")
    log.mk("START", "rules", x, "acked2")
    log.mk("END", "rules", x, "acked2")
    log.mk("START", "rules", log.rec("rules", "acked2", 2), "acked2", 2)
    # the copy was STARTed before the tracker wrote REDELIVERED for the old delivery
    old = log.rec("rules", "in_flight2")
    log.mk("START", "rules", old, "in_flight2")
    log.mk("START", "rules", log.rec("rules", "in_flight2", 2), "in_flight2", 2)
    log.mk("REDELIVERED", "rules", old, "in_flight2", 2)
    # redelivered; its copy waits on the queue topic
    y = log.rec("rules", "pending2")
    log.mk("START", "rules", y, "pending2")
    log.mk("REDELIVERED", "rules", y, "pending2", 2)
    log.rec("rules", "pending2", 2)
    # dead-lettered, then replayed into its queue
    z = log.rec("rules", "pending3")
    log.mk("START", "rules", z, "pending3")
    log.mk("DEAD_LETTERED", "rules", z, "pending3")
    log.rec("rules", "pending3")
    # a bad marker and one of a type from the future change nothing
    u = log.rec("rules", "in_flight3")
    log.mk("START", "rules", u, "in_flight3")
    log.mk("END", "rules", u, "in_flight3", error="not a protobuf marker")
    log.mk("UNKNOWN_42", "rules", u, "in_flight3")
    # markers of a record that is not on the queue topic: an orphan, not a send
    log.mk("START", "orphans", 999, "ghost")
    log.mk("END", "orphans", 999, "ghost")
    log.rec("orphans", "real")
    # for problems(): pending ones, oldest first
    for i in (3, 1, 2):
        log.rec("old", f"p{i}", t=i * 1000)


def _story(log: Log) -> None:
    """Deliveries with known latencies, causes and duplicates, in two queues and a DLQ."""
    for i, work in enumerate((100, 300)):
        o = log.rec("q", f"ok{i}", t=0)
        log.mk("START", "q", o, f"ok{i}", t=1000)
        log.mk("END", "q", o, f"ok{i}", t=1000 + work)
    n = log.rec("q", "nack", t=0)
    log.mk("START", "q", n, "nack", t=50)
    log.mk("NACK", "q", n, "nack", t=60, reason="bad")
    log.mk("REDELIVERED", "q", n, "nack", 2, t=70, reason="bad")
    n2 = log.rec("q", "nack", 2, t=70)
    log.mk("START", "q", n2, "nack", 2, t=80)
    log.mk("START", "q", n2, "nack", 2, t=85)  # started twice
    log.mk("END", "q", n2, "nack", 2, t=580)
    e = log.rec("q", "expired", t=0)
    log.mk("START", "q", e, "expired", t=10, lease=1000)  # overdue at LONG_AGO
    log.mk("REDELIVERED", "q", e, "expired", 2, t=31_000, reason="lease expired")
    e2 = log.rec("q", "expired", 2, t=31_000)
    log.mk("START", "q", e2, "expired", 2, t=31_010, lease=1000)
    r = log.rec("other", "rel", t=0)
    log.mk("START", "other", r, "rel", t=5)
    log.mk("RELEASE", "other", r, "rel", t=6)
    log.mk("REDELIVERED", "other", r, "rel", 1, t=7, reason="released")
    dl = log.rec("q.dlq", "dead", t=0, dlq=True)
    log.mk("START", "q.dlq", dl, "dead", t=10)
    log.mk("END", "q.dlq", dl, "dead", t=20)


STORY = ("q", "other", "q.dlq")


@pytest.fixture(scope="module")
def audit(spark: SparkSession) -> dict[str, Any]:
    """Every transform, run once over one log (persisted, so each runs on small data)."""
    log = Log()
    _rules(log)
    _story(log)
    records, markers = log.frames(spark)
    d = T.deliveries(records, markers).persist()
    m = T.messages(d).persist()
    story_d, story_m = d.where(d.queue.isin(*STORY)), m.where(m.queue.isin(*STORY))
    values = T.latency_values(d, m).collect()
    return {
        "messages": {(r["queue"], r["message_id"]): r.asDict() for r in m.collect()},
        "counts": {r["queue"]: r.asDict() for r in T.queue_counts(m, d, LONG_AGO).collect()},
        "types": {r["type_id"]: r["markers"] for r in T.marker_type_counts(markers).collect()},
        "dlqs": [r["queue"] for r in T.dead_letter_queues(records).collect()],
        "causes": {
            (r["queue"], r["cause"]): r["redeliveries"]
            for r in T.redelivery_causes(story_d).collect()
        },
        "reasons": [r.asDict() for r in T.redelivery_reasons(d, 1).where("queue = 'q'").collect()],
        "values": [(r["queue"], r["metric"], r["value_ms"]) for r in values],
        "attempts": {
            (r["queue"], r["attempts"]): r["messages"]
            for r in T.attempts_histogram(story_m).collect()
        },
        "activity": {
            (r["bucket_ms"], r["series"]): r["count"]
            for r in T.activity(T.activity_events(story_d, story_m, ["q.dlq"]), 10_000).collect()
        },
        "problems": [
            r["message_id"] for r in T.problems(m, "pending").where("queue = 'old'").collect()
        ],
    }


def test_each_status_rule(audit: dict[str, Any]) -> None:
    statuses = {mid: row["status"] for (q, mid), row in audit["messages"].items() if q == "rules"}
    assert statuses == {mid: mid.rstrip("23") for mid in statuses}
    assert len(statuses) == 12


def test_invalid_and_unknown_markers_are_counted_apart(audit: dict[str, Any]) -> None:
    types = audit["types"]
    assert (types[T.INVALID], types[42], types[MarkerType.KEEPALIVE]) == (1, 1, 1)


def test_markers_without_a_record_are_orphans_not_sends(audit: dict[str, Any]) -> None:
    ghost = audit["messages"][("orphans", "ghost")]
    assert (ghost["sent"], ghost["status"]) == (False, "acked")
    o = audit["counts"]["orphans"]
    assert (o["sent"], o["orphans"], o["acked"], o["pending"], o["delivered"]) == (1, 1, 0, 1, 1)


def test_queue_counts(audit: dict[str, Any]) -> None:
    counts = audit["counts"]
    q = counts["q"]
    want = {"sent": 4, "acked": 3, "in_flight": 1, "in_flight_overdue": 1, "delivered": 6,
            "start_markers": 7, "messages_delivered": 4, "duplicate_deliveries": 3,
            "duplicate_starts": 1, "redelivered": 2, "nacked": 1, "queue_records": 6}  # fmt: skip
    assert {k: q[k] for k in want} == want
    assert (q["first_sent_ms"], q["last_event_ms"], q["last_redelivered_ms"]) == (
        T0,
        T0 + 1300,
        T0 + 31_000,
    )
    assert counts["other"]["lost"] == 1 and counts["other"]["released"] == 1  # no copy
    assert counts["q.dlq"]["acked"] == 1
    assert audit["dlqs"] == ["q.dlq"]


def test_redelivery_causes_and_reasons(audit: dict[str, Any]) -> None:
    assert audit["causes"] == {
        ("q", "nacked"): 1,
        ("q", "lease_expired"): 1,
        ("other", "released"): 1,
    }
    assert [(r["reason"], r["redeliveries"]) for r in audit["reasons"]] == [("bad", 1)]


def test_latencies_and_attempts(audit: dict[str, Any]) -> None:
    values = audit["values"]
    processing = sorted(v for q, metric, v in values if q == "q" and metric == "processing_ms")
    assert processing == [100, 300, 500]  # the twice-started copy counts from its first START
    waits = sorted(v for q, metric, v in values if q in STORY and metric == "queue_wait_ms")
    assert waits == [5, 10, 10, 10, 10, 50, 1000, 1000]
    assert audit["attempts"] == {("q", 1): 2, ("q", 2): 2, ("other", 1): 1, ("q.dlq", 1): 1}


def test_activity_buckets(audit: dict[str, Any]) -> None:
    rows = audit["activity"]
    assert rows[(T0, "sent")] == 5
    assert rows[(T0, "acked")] == 3
    assert rows[(T0, "redelivered_nacked")] == 1
    assert rows[(T0 + 30_000, "redelivered_lease_expired")] == 1


def test_problems_lists_oldest_first(audit: dict[str, Any]) -> None:
    assert audit["problems"] == ["p1", "p2", "p3"]


def test_latency_bins_are_exact_below_a_second_and_logarithmic_above(spark: SparkSession) -> None:
    values = spark.createDataFrame(
        [("m", "q", v) for v in (0, 999, 999, 1000, 1011, 1012, 10_000, 123_456)],
        "metric string, queue string, value_ms long",
    )
    bins = {r["bin"]: (r["count"], r["sum"], r["max"]) for r in T.latency_bins(values).collect()}
    assert bins == {
        0: (1, 0, 0),
        999: (2, 1998, 999),
        1000: (2, 2011, 1011),  # [1000, 1011.579...)
        1001: (1, 1012, 1012),
        1200: (1, 10_000, 10_000),
        1418: (1, 123_456, 123_456),
    }


def test_messages_are_aggregated_in_a_hash_table(spark: SparkSession) -> None:
    # A struct or string in an aggregation buffer turns Spark's HashAggregate into a
    # SortAggregate: a sort of every delivery, measurably slower on a 1M audit.
    log = Log()
    _story(log)
    records, markers = log.frames(spark)
    messages = T.messages(T.deliveries(records, markers))
    plan = messages._jdf.queryExecution().executedPlan().toString()
    by_message = [
        line
        for line in plan.splitlines()
        if re.search(r"Aggregate\(keys?=\[queue#\d+, message_id#", line)
    ]
    assert len(by_message) == 2, plan  # partial and final
    assert all("HashAggregate" in line for line in by_message), plan
