"""kmq audit --follow's state without Spark: merging micro-batches, judging stuck messages,
eviction, bad input, persistence; and the streaming source's admission control."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kmq.audit.follow_output import render_html, render_prometheus
from kmq.audit.follow_state import FollowLimits, FollowState
from kmq.errors import ConfigError
from kmq.markers import MarkerType
from kmq.spark.splits import admit

LIMITS = FollowLimits(
    stuck_leases=2, pending_bound_ms=5_000, window_ms=60_000, settled_horizon_ms=10_000,
    orphan_after_ms=30_000,
)  # fmt: skip
T0 = 1_000_000


def record(offset: int, mid: str, attempt: int = 1, lane: int = 0, t: int = 0) -> dict[str, Any]:
    return {"lane": lane, "partition": 0, "offset": offset, "queue": "jobs", "message_id": mid,
            "attempt": attempt, "sent_ms": T0 + t}  # fmt: skip


def markers(offset: int, pos: int, t: int, *types: MarkerType, lane: int = 0,
            lease_ms: int = 1000) -> dict[str, Any]:  # fmt: skip
    """One delivery's markers of one batch, compacted as kmq.audit.follow does."""
    start = MarkerType.START in types
    settle = [x for x in types if x not in (MarkerType.START, MarkerType.KEEPALIVE)]
    return {
        "lane": lane, "partition": 0, "offset": offset, "m_queue": None, "m_message_id": None,
        "m_attempt": None, "starts": types.count(MarkerType.START),
        "first_start_ms": T0 + t if start else None, "last_start_pos": pos if start else None,
        "last_start_ms": T0 + t if start else None, "lease_ms": lease_ms if start else None,
        "end_ms": T0 + t + 10 if MarkerType.END in types else None,
        "last_settle_pos": pos + 1 if settle else None,
        "last_settle_type": int(settle[-1]) if settle else None,
        "redelivered_ms": T0 + t if MarkerType.REDELIVERED in types else None,
        "dead_lettered": MarkerType.DEAD_LETTERED in types, "first_ms": T0 + t, "last_ms": T0 + t,
    }  # fmt: skip


def test_a_held_message_is_stuck_until_its_redelivered_copy_is_acked() -> None:
    s = FollowState(limits=LIMITS)
    s.apply(0, [record(0, "a"), record(1, "b")], [markers(0, 0, 100, MarkerType.START)], {})
    view = s.view(T0 + 1500)  # 1.4 s: within two leases
    assert view["stuck"] == [] and view["current"]["jobs"] == {"in_flight": 1, "pending": 1}
    view = s.view(T0 + 6000)
    assert {r["message_id"]: r["why"] for r in view["stuck"]} == {
        "a": "in_flight_too_long", "b": "never_started"
    }  # fmt: skip
    # The tracker redelivers a (a copy on the retry topic), a worker acks the copy.
    s.apply(1, [record(0, "a", attempt=2, lane=1, t=6000)],
            [markers(0, 2, 6000, MarkerType.REDELIVERED)], {})  # fmt: skip
    assert s.view(T0 + 6500)["current"]["jobs"] == {"pending": 2, "stuck": 1}
    s.apply(2, [], [markers(0, 4, 6100, MarkerType.START, MarkerType.END, lane=1)], {})
    view = s.view(T0 + 7000)
    assert [r["message_id"] for r in view["stuck"]] == ["b"]
    assert view["window"]["jobs"]["acked"] == 1 and view["window"]["jobs"]["redelivered"] == 1
    assert view["window"]["jobs"]["latency_ms"]["processing_ms"]["count"] == 1
    assert view["window"]["jobs"]["latency_ms"]["end_to_end_ms"]["max"] == 6110
    assert not s.apply(2, [record(9, "z")], [], {})  # a batch applied already is skipped


def test_version_2_markers_wait_for_their_record_then_orphans_are_counted() -> None:
    s = FollowState(limits=LIMITS)
    s.apply(0, [], [markers(0, 0, 0, MarkerType.START), markers(7, 1, 0, MarkerType.END)], {})
    assert s.size()["unresolved"] == 2
    s.apply(1, [record(0, "a")], [], {"INVALID": 2}, {"undecodable": 2})
    assert s.size()["unresolved"] == 1 and s.view(T0)["current"]["jobs"] == {"in_flight": 1}
    s.evict(T0 + 40_000)
    assert s.size()["unresolved"] == 0
    assert s.bad_input == {"undecodable": 2, "orphan_end": 1}
    assert s.markers == {"INVALID": 2}


def test_settled_messages_leave_the_state_and_old_buckets_the_window() -> None:
    s = FollowState(limits=LIMITS)
    s.apply(0, [record(0, "a"), record(1, "b")],
            [markers(0, 0, 10, MarkerType.START, MarkerType.END)], {})  # fmt: skip
    s.evict(T0 + 5_000)
    assert set(s.messages) == {("jobs", "a"), ("jobs", "b")}
    s.evict(T0 + 20_000)  # a is settled and past the horizon; b is pending
    assert set(s.messages) == {("jobs", "b")} and s.size()["deliveries"] == 1
    assert s.view(T0 + 20_000)["window"]["jobs"]["sent"] == 2
    s.evict(T0 + 200_000)
    assert s.window == {} and s.view(T0 + 200_000)["window"] == {}


def test_state_survives_a_round_trip_through_json() -> None:
    s = FollowState(limits=LIMITS)
    s.apply(3, [record(0, "a"), record(1, "b")], [markers(0, 0, 10, MarkerType.START),
            markers(5, 1, 10, MarkerType.START)], {"START": 2})  # fmt: skip
    back = FollowState.from_json(json.loads(json.dumps(s.to_json())), LIMITS)
    assert back.view(T0 + 9000) == s.view(T0 + 9000)
    assert (back.batch_id, back.size(), back.markers) == (3, s.size(), s.markers)
    back.apply(4, [record(5, "c")], [], {})
    assert back.view(T0 + 9000)["current"]["jobs"] == {"in_flight": 2, "pending": 1, "stuck": 3}


def test_outputs_render() -> None:
    s = FollowState(limits=LIMITS)
    s.apply(0, [record(0, 'a"<x>')], [], {})
    summary = {"as_of": "now", "as_of_ms": T0, "batch_id": 0, "window_s": 60.0,
               "bad_input": {"orphan_end": 1}, "state": s.size(),
               **s.view(T0 + 10_000)}  # fmt: skip
    page = render_html(summary, 2.0)
    assert '<meta http-equiv="refresh" content="2">' in page and "a&quot;&lt;x&gt;" in page
    prom = render_prometheus(summary)
    assert 'kmq_audit_stuck_messages{queue="jobs"} 1' in prom
    assert 'kmq_audit_bad_input{kind="orphan_end"} 1' in prom


def test_admit_shares_the_budget_fairly() -> None:
    assert admit({0: 0, 1: 0}, {0: 5, 1: 5}, 100) == {0: 5, 1: 5}
    assert admit({0: 0, 1: 0, 2: 0}, {0: 2, 1: 50, 2: 50}, 10) == {0: 2, 1: 4, 2: 4}
    assert admit({0: 10, 1: 0}, {0: 100, 1: 100}, 7) == {0: 13, 1: 4}
    assert admit({0: 3}, {0: 3, 1: 4}, 2) == {0: 3, 1: 2}  # a new partition starts at 0
    with pytest.raises(ConfigError):
        admit({}, {}, 0)
