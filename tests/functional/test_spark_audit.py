"""`kmq audit` end to end: a real local Spark session against a real broker, on a scenario
written record by record, so every count is known exactly."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaProducer
from pyspark.sql import SparkSession

from kmq._proto import marker_pb2
from kmq.cli import main
from kmq.config import ServiceConfig
from kmq.markers import Marker, MarkerType, encode
from kmq.records import dead_letter_headers, queue_headers
from kmq.topics import ensure_topics

MINUTE_MS = 60_000


@dataclass
class Scenario:
    """Writes queue records and markers exactly as kmq's producer, consumers and tracker
    would, with explicit timestamps (``t`` is ms after ``t0``)."""

    bootstrap: str
    queue_topic: str
    marker_topic: str
    t0: int
    producer: KafkaProducer = field(init=False)
    _rr: int = 0

    def __post_init__(self) -> None:
        self.producer = KafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )

    def record(
        self,
        queue: str,
        mid: str,
        attempt: int,
        t: int,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> tuple[int, int]:
        self._rr += 1
        meta = self.producer.send(
            self.queue_topic,
            key=queue.encode(),
            value=b"payload-" + mid.encode(),
            headers=headers if headers is not None else queue_headers(mid, attempt, ()),
            partition=self._rr % 2,
            timestamp_ms=self.t0 + t,
        ).get(timeout=30)
        return meta.partition, meta.offset

    def marker(
        self,
        kind: MarkerType,
        queue: str,
        at: tuple[int, int],
        mid: str,
        attempt: int,
        t: int,
        *,
        lease_ms: int = 30_000,
        reason: str = "",
        dlq: str = "",
    ) -> None:
        marker = Marker(
            type=kind,
            queue=queue,
            partition=at[0],
            offset=at[1],
            message_id=mid,
            attempt=attempt,
            redeliver_after_ms=lease_ms if kind in (MarkerType.START, MarkerType.KEEPALIVE) else 0,
            reason=reason,
            dead_letter_queue=dlq,
        )
        self.raw_marker(mid.encode(), encode(marker), t)

    def raw_marker(self, key: bytes, value: bytes, t: int) -> None:
        self.producer.send(self.marker_topic, key=key, value=value, timestamp_ms=self.t0 + t)

    def processed(self, queue: str, at: tuple[int, int], mid: str, attempt: int, start: int,
                  end: int) -> None:  # fmt: skip
        self.marker(MarkerType.START, queue, at, mid, attempt, start)
        self.marker(MarkerType.END, queue, at, mid, attempt, end)


def write_scenario(s: Scenario) -> None:
    S, N, R = MarkerType.START, MarkerType.NACK, MarkerType.REDELIVERED
    o = "orders"
    # acked at once: processing 100, 200, 300 ms; queue wait 1000 ms
    for i in (1, 2, 3):
        s.processed(o, s.record(o, f"A{i}", 1, 0), f"A{i}", 1, 1000, 1000 + 100 * i)
    # nacked, redelivered, acked (processing 400)
    r1 = s.record(o, "R1", 1, 0)
    s.marker(S, o, r1, "R1", 1, 1000)
    s.marker(N, o, r1, "R1", 1, 1100, reason="bad input")
    r1b = s.record(o, "R1", 2, 1200)
    s.marker(R, o, r1, "R1", 2, 1200, reason="bad input")
    s.processed(o, r1b, "R1", 2, 1300, 1700)
    # lease expired, redelivered, acked (processing 500)
    r2 = s.record(o, "R2", 1, 0)
    s.marker(S, o, r2, "R2", 1, 1000)
    r2b = s.record(o, "R2", 2, 31_000)
    s.marker(R, o, r2, "R2", 2, 31_000, reason="lease expired")
    s.processed(o, r2b, "R2", 2, 31_500, 32_000)
    # released unseen, redelivered with the same attempt, acked (processing 600)
    r3 = s.record(o, "R3", 1, 0)
    s.marker(S, o, r3, "R3", 1, 1000)
    s.marker(MarkerType.RELEASE, o, r3, "R3", 1, 1050, reason="released unseen")
    r3b = s.record(o, "R3", 1, 1100)
    s.marker(R, o, r3, "R3", 1, 1100, reason="released unseen")
    s.processed(o, r3b, "R3", 1, 1200, 1800)
    # one record started twice (a consumer died before committing), acked (processing 700)
    dup = s.record(o, "DUP", 1, 0)
    s.marker(S, o, dup, "DUP", 1, 1000)
    s.processed(o, dup, "DUP", 1, 1050, 1700)
    # out of attempts: the tracker dead-letters it; nobody took the dead letter yet
    d1 = s.record(o, "D1", 1, 0)
    s.marker(S, o, d1, "D1", 1, 1000)
    s.marker(N, o, d1, "D1", 1, 1100, reason="poison")
    d1b = s.record(o, "D1", 2, 1200)
    s.marker(R, o, d1, "D1", 2, 1200, reason="poison")
    s.marker(S, o, d1b, "D1", 2, 1300)
    s.marker(N, o, d1b, "D1", 2, 1400, reason="poison")
    s.record("orders.dlq", "D1", 1, 1500, dead_letter_headers("D1", o, 2, "poison", ()))
    s.marker(MarkerType.DEAD_LETTERED, o, d1b, "D1", 3, 1500, reason="poison", dlq="orders.dlq")
    # rejected by the consumer; the dead letter was then consumed from orders.dlq
    d2 = s.record(o, "D2", 1, 0)
    s.marker(S, o, d2, "D2", 1, 1000)
    d2q = s.record("orders.dlq", "D2", 1, 1100, dead_letter_headers("D2", o, 1, "invalid", ()))
    s.marker(MarkerType.DEAD_LETTERED, o, d2, "D2", 1, 1100, reason="invalid", dlq="orders.dlq")
    s.processed("orders.dlq", d2q, "D2", 1, 2000, 2050)
    # dead-lettered, then replayed into orders: pending again there
    x1 = s.record(o, "X1", 1, 0)
    s.marker(S, o, x1, "X1", 1, 1000)
    x1q = s.record("orders.dlq", "X1", 1, 1100, dead_letter_headers("X1", o, 1, "invalid", ()))
    s.marker(MarkerType.DEAD_LETTERED, o, x1, "X1", 1, 1100, reason="invalid", dlq="orders.dlq")
    s.processed("orders.dlq", x1q, "X1", 1, 2000, 2060)
    s.record(o, "X1", 1, 2100)
    # in flight; its lease ran out long ago (the tracker is behind)
    f1 = s.record(o, "F1", 1, 0)
    s.marker(S, o, f1, "F1", 1, 1000)
    s.marker(MarkerType.KEEPALIVE, o, f1, "F1", 1, 2000)
    # in flight on its second delivery, lease good for an hour
    f2 = s.record(o, "F2", 1, 0)
    s.marker(S, o, f2, "F2", 1, 1000)
    f2b = s.record(o, "F2", 2, 31_000)
    s.marker(R, o, f2, "F2", 2, 31_000, reason="lease expired")
    s.marker(S, o, f2b, "F2", 2, 31_500, lease_ms=3_600_000)
    # never started
    s.record(o, "P1", 1, 0)
    # nacked with a long delay: the tracker will redeliver it later
    w1 = s.record(o, "W1", 1, 0)
    s.marker(S, o, w1, "W1", 1, 1000)
    s.marker(N, o, w1, "W1", 1, 1100, reason="retry later")
    # lost: the tracker says it redelivered, but the copy is not on the queue topic
    l1 = s.record(o, "L1", 1, 0)
    s.marker(S, o, l1, "L1", 1, 1000)
    s.marker(N, o, l1, "L1", 1, 1100, reason="flaky")
    s.marker(R, o, l1, "L1", 2, 1200, reason="flaky")
    # a second queue: one acked (processing 800), one lost after its lease expired
    s.processed("emails", s.record("emails", "E1", 1, 0), "E1", 1, 1000, 1800)
    e2 = s.record("emails", "E2", 1, 0)
    s.marker(S, "emails", e2, "E2", 1, 1000)
    s.marker(R, "emails", e2, "E2", 2, 31_000, reason="lease expired")
    # noise the audit must skip: a record that is no marker, a marker type and a version from
    # the future
    s.raw_marker(b"junk", b"\xff\xfe not protobuf", 0)
    future = marker_pb2.Marker(version=1, type=42, queue=o, message_id="A1", attempt=1)  # type: ignore[arg-type]
    s.raw_marker(b"A1", future.SerializeToString(), 5000)
    version_9 = marker_pb2.Marker(version=9, type=1, queue=o, message_id="A1", attempt=1)  # type: ignore[arg-type]
    s.raw_marker(b"A1", version_9.SerializeToString(), 5000)
    s.producer.flush()
    s.producer.close()


@pytest.fixture(scope="module")
def audited(bootstrap: str, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tag = uuid.uuid4().hex[:8]
    queue_topic, marker_topic = f"audit{tag}.queue", f"audit{tag}.markers"
    ensure_topics(
        ServiceConfig(
            bootstrap_servers=bootstrap,
            queue_topic=queue_topic,
            marker_topic=marker_topic,
            queue_partitions=2,
            marker_partitions=3,
        )
    )
    t0 = int(time.time() * 1000) - 10 * MINUTE_MS
    write_scenario(Scenario(bootstrap, queue_topic, marker_topic, t0))
    out = tmp_path_factory.mktemp("audit")
    result = CliRunner().invoke(
        main,
        [
            "audit",
            "--bootstrap-servers", bootstrap,
            "--queue-topic", queue_topic,
            "--marker-topic", marker_topic,
            "--output", str(out),
            "--check", "no-loss",
            "--max-records-per-split", "1000",
        ],
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    return result, summary, out, t0


def test_every_count_of_the_scenario_is_exact(audited: Any) -> None:
    _, summary, _, _ = audited
    orders = summary["queues"]["orders"]
    expected_orders = {
        "sent": 15,
        "acked": 7,
        "dead_lettered": 2,
        "in_flight": 2,
        "in_flight_overdue": 1,
        "pending": 2,
        "awaiting_redelivery": 1,
        "lost": 1,
        "delivered": 19,
        "nacked": 5,
        "released": 1,
        "redelivered": 6,
        "messages_redelivered": 6,
        "duplicate_deliveries": 6,
        "duplicate_starts": 1,
        "acked_more_than_once": 0,
        "orphans": 0,
        "queue_records": 21,
        "dead_letter_queue": False,
    }
    assert {k: orders[k] for k in expected_orders} == expected_orders
    assert orders["attempts"] == {"1": 10, "2": 4}
    assert orders["redelivery_causes"] == {"lease_expired": 2, "nacked": 3, "released": 1}
    assert orders["redelivery_reasons"] == {
        "lease expired": 2,
        "bad input": 1,
        "flaky": 1,
        "poison": 1,
        "released unseen": 1,
    }
    emails = summary["queues"]["emails"]
    assert (emails["sent"], emails["acked"], emails["lost"], emails["redelivered"]) == (2, 1, 1, 1)
    assert emails["redelivery_causes"] == {"lease_expired": 1}


def test_dead_letter_queue_is_reported_apart_from_the_overall_figures(audited: Any) -> None:
    _, summary, _, _ = audited
    dlq = summary["queues"]["orders.dlq"]
    assert dlq["dead_letter_queue"] is True
    assert (dlq["sent"], dlq["acked"], dlq["pending"], dlq["lost"]) == (3, 2, 1, 0)
    assert summary["snapshot"]["dead_letter_queues"] == ["orders.dlq"]
    overall = summary["overall"]
    assert (overall["sent"], overall["acked"], overall["dead_lettered"]) == (17, 8, 2)
    assert (overall["in_flight"], overall["pending"], overall["awaiting_redelivery"]) == (2, 2, 1)
    assert overall["lost"] == 2
    assert overall["attempts"] == {"1": 12, "2": 4}
    assert summary["ok"] is False and summary["settled"] is False


def test_latency_percentiles(audited: Any) -> None:
    _, summary, _, _ = audited
    processing = summary["queues"]["orders"]["latency_ms"]["processing_ms"]
    assert (processing["count"], processing["p50"], processing["max"]) == (7, 400, 700)
    overall = summary["overall"]["latency_ms"]
    assert (overall["processing_ms"]["count"], overall["processing_ms"]["max"]) == (8, 800)
    wait = summary["queues"]["orders"]["latency_ms"]["queue_wait_ms"]
    assert (wait["p50"], wait["max"]) == (1000, 1000)
    dlq_processing = summary["queues"]["orders.dlq"]["latency_ms"]["processing_ms"]
    assert (dlq_processing["count"], dlq_processing["max"]) == (2, 60)


def test_markers_by_type_count_the_bad_and_the_unknown(audited: Any) -> None:
    _, summary, _, _ = audited
    assert summary["markers"]["INVALID"] == 2
    assert summary["markers"]["UNKNOWN_42"] == 1
    assert summary["bad_input"] == {
        "undecodable": 1, "unknown_version": 1, "unknown_type": 1, "orphans": 0
    }  # fmt: skip
    assert summary["markers"]["DEAD_LETTERED"] == 3
    assert summary["snapshot"]["marker_records"] == sum(summary["markers"].values())


def test_samples_name_the_unsettled_messages_oldest_first(audited: Any) -> None:
    _, summary, _, t0 = audited
    samples = summary["samples"]
    assert [r["message_id"] for r in samples["lost"]] == ["E2", "L1"]  # same age: by queue
    assert [r["message_id"] for r in samples["in_flight"]] == ["F1", "F2"]
    assert samples["in_flight"][0]["since_ms"] == t0 + 1000
    assert [r["message_id"] for r in samples["awaiting_redelivery"]] == ["W1"]
    assert sorted(r["message_id"] for r in samples["pending"]) == ["P1", "X1"]
    assert sorted(r["message_id"] for r in samples["dead_lettered"]) == ["D1", "D2"]


def test_cli_checks_reports_progress_and_writes_the_report(audited: Any) -> None:
    result, summary, out, _ = audited
    assert result.exit_code == 3, result.output
    assert "check no-loss failed: 2 of 17 sent messages lost" in result.output
    assert "[1/7] snapshot the high watermarks ..." in result.output
    assert "lost=2" in result.output
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "2 messages lost" in page and "orders.dlq" in page
    assert summary["timing_s"]["total"] > 0
