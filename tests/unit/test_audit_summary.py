"""summary.json assembly, the --check verdicts and the HTML report, from plain rows."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from kmq.audit.report import render_html
from kmq.audit.summary import (
    COUNTS,
    SCHEMA,
    build_summary,
    check_failures,
    choose_bucket_ms,
    percentiles,
    plot_bin,
)

T0 = 1_700_000_000_000
SNAPSHOT = {"as_of": "2026-01-01T00:00:00+00:00", "bootstrap_servers": "h:1",
            "queue_topic": "kmq.queue", "marker_topic": "kmq.markers", "queue_records": 12,
            "marker_records": 30}  # fmt: skip


def _counts(queue: str, **values: int) -> dict[str, Any]:
    return {"queue": queue, **dict.fromkeys(COUNTS, 0), **values}


def _bin(queue: str, b: int, count: int, total: int, top: int, metric: str = "processing_ms"
         ) -> dict[str, Any]:  # fmt: skip
    return {"metric": metric, "queue": queue, "bin": b, "count": count, "sum": total, "max": top}


def _summary(**orders: int) -> dict[str, Any]:
    base = {"sent": 9, "acked": 5, "dead_lettered": 1, "in_flight": 1, "pending": 1, "lost": 1}
    return build_summary(
        snapshot=SNAPSHOT,
        dead_letter_queues=["orders.dlq"],
        counts=[
            _counts("orders", **{**base, **orders}),
            _counts("emails", sent=1, acked=1),
            _counts("orders.dlq", sent=1, pending=1),
        ],
        latency_bins=[
            _bin("orders", 5, 2, 10, 5),
            _bin("emails", 1200, 1, 10_050, 10_050),
            _bin("orders.dlq", 7, 1, 7, 7),
        ],
        attempts=[
            {"queue": "orders", "attempts": 2, "messages": 3},
            {"queue": "orders", "attempts": 1, "messages": 5},
            {"queue": "emails", "attempts": 1, "messages": 1},
            {"queue": "orders.dlq", "attempts": 1, "messages": 1},
        ],
        causes=[
            {"queue": "orders", "cause": "nacked", "redeliveries": 2},
            {"queue": "emails", "cause": "nacked", "redeliveries": 1},
        ],
        reasons=[
            {"queue": "orders", "reason": "b", "redeliveries": 1},
            {"queue": "emails", "reason": "a", "redeliveries": 1},
            {"queue": "orders", "reason": "z", "redeliveries": 5},
            {"queue": "emails", "reason": "z", "redeliveries": 1},
        ],
        marker_types=[{"type": "START", "markers": 20}, {"type": "INVALID", "markers": 1}],
        activity=[
            {"bucket_ms": T0 + 1000, "series": "sent", "count": 4},
            {"bucket_ms": T0, "series": "sent", "count": 6},
            {"bucket_ms": T0, "series": "redelivered_nacked", "count": 2},
        ],
        bucket_ms=1000,
        samples={
            "lost": [
                {
                    "queue": "orders",
                    "message_id": "m<1>",
                    "latest_attempt": 2,
                    "deliveries": 2,
                    "sent_ms": T0,
                    "since_ms": T0,
                    "lease_until_ms": None,
                }
            ]
        },
        top_reasons=2,
    )


def test_overall_adds_up_the_queues_but_not_dead_letter_queues() -> None:
    s = _summary()
    assert s["schema"] == SCHEMA and (s["ok"], s["settled"]) == (False, False)
    o = s["overall"]
    assert (o["sent"], o["acked"], o["pending"], o["lost"]) == (10, 6, 1, 1)
    assert o["attempts"] == {"1": 6, "2": 3}
    assert o["redelivery_causes"] == {"nacked": 3}
    assert o["redelivery_reasons"] == {"z": 6, "a": 1}  # top 2: by count, then by name
    assert o["latency_ms"]["processing_ms"] == {
        "count": 3, "mean": 3353.333, "max": 10_050, "p50": 5, "p90": 10_050, "p99": 10_050
    }  # fmt: skip
    assert s["queues"]["orders.dlq"]["dead_letter_queue"] is True
    assert s["queues"]["orders"]["dead_letter_queue"] is False
    assert s["queues"]["orders.dlq"]["latency_ms"]["processing_ms"]["max"] == 7
    assert s["queues"]["orders"]["latency_ms"]["queue_wait_ms"]["p50"] is None
    assert s["snapshot"]["dead_letter_queues"] == ["orders.dlq"]
    assert s["series"]["latency_histogram"]["processing_ms"] == [[3.981, 2], [10000.0, 1]]
    assert s["series"]["activity"]["series"]["sent"] == [[T0, 6], [T0 + 1000, 4]]
    assert s["markers"] == {"INVALID": 1, "START": 20}
    assert set(s["samples"]) == {"dead_lettered", "in_flight", "pending", "awaiting_redelivery",
                                 "lost"}  # fmt: skip


def test_percentiles_are_nearest_rank_over_bins() -> None:
    bins = [{"bin": b, "count": 1, "sum": b, "max": b} for b in range(100, 800, 100)]
    got = percentiles(reversed(bins))
    assert got == {"count": 7, "mean": 400.0, "max": 700, "p50": 400, "p90": 700, "p99": 700}
    assert percentiles([])["p50"] is None


@pytest.mark.parametrize(
    ("latency_bin", "expected"),
    [
        (0, -1),
        (1, 0),
        (9, 9),
        (100, 20),
        (999, 29),
        (1000, 30),
        (1019, 30),
        (1020, 31),
        (1200, 40),
    ],
)
def test_plot_bins_are_tenths_of_a_decade(latency_bin: int, expected: int) -> None:
    assert plot_bin(latency_bin) == expected


def test_checks() -> None:
    assert check_failures(_summary(), "none") == []
    assert check_failures(_summary(), "no-loss") == ["1 of 10 sent messages lost"]
    assert check_failures(_summary(), "settled") == [
        "1 of 10 sent messages lost",
        "1 messages in flight",
        "1 messages pending",
    ]
    settled = _summary(acked=8, in_flight=0, pending=0, lost=0)
    assert (settled["ok"], settled["settled"]) == (True, True)  # the DLQ's pending one aside
    assert check_failures(settled, "settled") == []
    with pytest.raises(ValueError, match="check must be"):
        check_failures(settled, "strict")


@pytest.mark.parametrize(
    ("span_ms", "bucket_ms"),
    [
        (0, 1000),
        (59_000, 1000),
        (61_000, 2000),
        (3_600_000, 60_000),
        (30 * 86_400_000, 43_200_000),
        (365 * 86_400_000, 7 * 86_400_000),
    ],
)
def test_bucket_choice(span_ms: int, bucket_ms: int) -> None:
    assert choose_bucket_ms(T0, T0 + span_ms) == bucket_ms
    assert choose_bucket_ms(None, None) == 1000


def test_report_is_one_self_contained_page() -> None:
    page = render_html(_summary())
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "1 messages lost" in page and "orders.dlq" in page
    assert "m&lt;1&gt;" in page and "m<1>" not in page  # escaped
    assert not re.search(r'(src|href)="(http|//)', page)  # nothing fetched from elsewhere


def test_report_of_an_empty_audit() -> None:
    s = build_summary(
        snapshot={**SNAPSHOT, "queue_records": 0, "marker_records": 0}, dead_letter_queues=[],
        counts=[], latency_bins=[], attempts=[], causes=[], reasons=[], marker_types=[],
        activity=[], bucket_ms=1000, samples={},
    )  # fmt: skip
    assert (s["ok"], s["settled"], s["overall"]["sent"]) == (True, True, 0)
    page = render_html(s)
    assert "no message lost" in page and "every sent message was acked" in page
