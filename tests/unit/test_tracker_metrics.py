"""The tracker's metrics, probes and Kafka-reachability log (tracker.metrics, tracker.view,
tracker.health) against partition states with known contents; no broker."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

import kmq
from kmq import logs, reach
from kmq.markers import Marker, MarkerType, encode_batch
from kmq.records import delivery_key
from tracker.health import BrokerLink, ProbeServer
from tracker.metrics import registry
from tracker.stall import Change, Stall
from tracker.state import READ_AT_STEP_S, PartitionState
from tracker.view import TrackerView, partition_view

NOW = 1000.0
LEASE_MS = 10_000


def feed(state: PartitionState, offset: int, marker: Marker, now: float) -> None:
    state.on_record(offset, encode_batch([marker]), now)


def start(offset: int, **kw: object) -> Marker:
    return Marker(MarkerType.START, partition=1, offset=offset, redeliver_after_ms=LEASE_MS,
                  **kw)  # type: ignore[arg-type]  # fmt: skip


def known_state() -> PartitionState:
    """Partition 0: six STARTs read 50 s to 10 s ago; one acked, one kept alive, one
    nacked and redelivered, one rejected and dead-lettered, one left to run out and
    redelivered; a junk record; the partition's end 7 records past the position."""
    s = PartitionState(0)
    s.set_position(10)
    s.set_end_offset(10)
    feed(s, 10, start(100), NOW - 50)  # acked below: not the oldest in flight
    feed(s, 11, start(101), NOW - 40)  # stays in flight: the oldest
    feed(s, 12, start(102), NOW - 30)
    feed(s, 13, start(103), NOW - 20)
    feed(s, 14, start(104), NOW - 15)
    feed(s, 15, start(105), NOW - 10)
    feed(s, 16, Marker(MarkerType.END, partition=1, offset=100), NOW - 9)
    feed(s, 17, Marker(MarkerType.KEEPALIVE, partition=1, offset=101,
                       redeliver_after_ms=LEASE_MS), NOW - 9)  # fmt: skip
    feed(s, 18, Marker(MarkerType.NACK, partition=1, offset=102, reason="busy"), NOW - 9)
    feed(s, 19, Marker(MarkerType.REJECT, partition=1, offset=103, reason="bad"), NOW - 9)
    s.on_record(20, b"\x00junk", NOW - 9)
    due = {d.key: d for d in s.due(NOW - 9)}
    assert set(due) == {delivery_key(0, 1, 102), delivery_key(0, 1, 103)}
    s.redelivered(delivery_key(0, 1, 102))
    s.redelivered(delivery_key(0, 1, 103), dead_lettered=True)
    due = {d.key: d for d in s.due(NOW - 1)}  # 104 ran out at NOW - 5, 105 runs out at NOW
    assert set(due) == {delivery_key(0, 1, 104)}
    s.redelivered(delivery_key(0, 1, 104))
    s.highwater = 28
    return s


def replaying_state() -> PartitionState:
    s = PartitionState(1)
    s.set_position(0)
    s.set_end_offset(5)
    s.highwater = 5
    return s


def view_of(*states: PartitionState, **overrides: object) -> TrackerView:
    parts = tuple(partition_view(s, NOW) for s in states)
    totals: dict[str, int] = {"fenced": 2}
    for p in parts:
        for key, count in p.stats.items():
            totals[key] = totals.get(key, 0) + count
    base = TrackerView(
        connecting=False,
        broker_up=True,
        broker_problem="",
        group_stable=True,
        assignment_known=True,
        last_turn_age_s=0.05,
        partitions=parts,
        totals=totals,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def sample(view: TrackerView, name: str, **labels: str) -> float | None:
    return registry(lambda: view).get_sample_value(name, labels)


def test_partition_counters_come_from_the_state() -> None:
    v = view_of(known_state(), replaying_state())
    reads = {
        kind: sample(v, "kmq_tracker_markers_read_total", partition="0", type=kind)
        for kind in ("start", "end", "keepalive", "nack", "reject", "release")
    }
    assert reads == {"start": 6, "end": 1, "keepalive": 1, "nack": 1, "reject": 1, "release": 0}
    redelivered = {
        reason: sample(v, "kmq_tracker_redeliveries_total", partition="0", reason=reason)
        for reason in ("lease_expired", "nacked", "released", "rejected")
    }
    assert redelivered == {"lease_expired": 1, "nacked": 1, "released": 0, "rejected": 0}
    assert sample(v, "kmq_tracker_dead_letters_total", partition="0", reason="rejected") == 1
    assert sample(v, "kmq_tracker_dead_letters_total", partition="0", reason="nacked") == 0
    assert sample(v, "kmq_tracker_bad_markers_total", partition="0") == 1
    assert sample(v, "kmq_tracker_markers_read_total", partition="1", type="start") == 0


def test_partition_gauges_in_flight_oldest_age_lag_and_replay_gate() -> None:
    v = view_of(known_state(), replaying_state())
    assert sample(v, "kmq_tracker_in_flight_messages", partition="0") == 2  # 101 and 105
    # 100 was read 50 s ago but acked; 101, read 40 s ago, is the oldest still in flight.
    assert sample(v, "kmq_tracker_oldest_in_flight_age_seconds", partition="0") == 40
    assert sample(v, "kmq_tracker_marker_lag_records", partition="0") == 28 - 21
    assert sample(v, "kmq_tracker_replaying", partition="0") == 0
    assert sample(v, "kmq_tracker_replaying", partition="1") == 1
    assert sample(v, "kmq_tracker_marker_lag_records", partition="1") == 5
    assert sample(v, "kmq_tracker_oldest_in_flight_age_seconds", partition="1") == 0
    assert sample(v, "kmq_tracker_partitions_assigned") == 2


def test_oldest_age_moves_on_when_the_oldest_settles() -> None:
    s = known_state()
    feed(s, 21, Marker(MarkerType.END, partition=1, offset=101), NOW)
    assert sample(view_of(s), "kmq_tracker_oldest_in_flight_age_seconds", partition="0") == 10
    feed(s, 22, Marker(MarkerType.END, partition=1, offset=105), NOW)
    assert sample(view_of(s), "kmq_tracker_oldest_in_flight_age_seconds", partition="0") == 0
    assert sample(view_of(s), "kmq_tracker_in_flight_messages", partition="0") == 0


def test_a_record_of_several_starts_stays_in_the_age_until_its_last_settles() -> None:
    s = PartitionState(0)
    s.set_position(0)
    s.set_end_offset(0)
    s.on_record(0, encode_batch([start(1), start(2)]), NOW - 30)
    feed(s, 1, start(3), NOW - 5)
    feed(s, 2, Marker(MarkerType.END, partition=1, offset=1), NOW)
    assert sample(view_of(s), "kmq_tracker_oldest_in_flight_age_seconds", partition="0") == 30
    feed(s, 3, Marker(MarkerType.END, partition=1, offset=2), NOW)
    assert sample(view_of(s), "kmq_tracker_oldest_in_flight_age_seconds", partition="0") == 5


def test_the_oldest_read_time_is_early_by_less_than_a_step_and_kept_per_step() -> None:
    """STARTs read within READ_AT_STEP_S of the last noted read time share it: the age
    gauge may overstate by less than the step, and the state keeps a read time per step
    of the clock, not per message in flight."""
    s = PartitionState(0)
    s.set_position(0)
    s.set_end_offset(0)
    step = READ_AT_STEP_S
    feed(s, 0, start(1), NOW - 30)
    for i in range(2, 1000):
        feed(s, i - 1, start(i), NOW - 30 + step * 0.9 * i / 1000)  # all within one step
    feed(s, 999, start(1000), NOW - 20)
    feed(s, 1000, Marker(MarkerType.END, partition=1, offset=1), NOW)
    assert len(s._read_marks) == 2  # the last START was held aside until this END (young_s)
    # The oldest in flight was read 0.0009 s after the first: reported as read with it.
    assert s.oldest_read_at() == NOW - 30
    for i in range(2, 1000):
        feed(s, 1000 + i, Marker(MarkerType.END, partition=1, offset=i), NOW)
    assert s.oldest_read_at() == NOW - 20 and len(s._read_marks) == 1
    feed(s, 2000, Marker(MarkerType.END, partition=1, offset=1000), NOW)
    assert s.oldest_read_at() is None and len(s._read_marks) == 0


def test_other_counters_are_events_and_none_is_exposed_twice() -> None:
    v = view_of(known_state())
    assert sample(v, "kmq_tracker_events_total", event="fenced") == 2
    assert sample(v, "kmq_tracker_events_total", event="start") is None
    assert sample(v, "kmq_tracker_events_total", event="redeliveries") is None
    assert sample(v, "kmq_tracker_events_total", event="bad_marker") is None
    names = {m.name for m in registry(lambda: v).collect()}
    assert all(n.startswith("kmq_tracker_") for n in names)


@pytest.mark.parametrize(
    ("overrides", "ready", "problem"),
    [
        ({}, True, None),
        ({"connecting": True, "broker_up": False, "broker_problem": "refused"}, False,
         "connecting to Kafka (refused)"),
        ({"broker_up": False, "broker_problem": "reset"}, False, "Kafka unreachable: reset"),
        ({"group_stable": False}, False, "not a settled member of its group yet"),
        ({"assignment_known": False}, False, "not a settled member of its group yet"),
    ],
)  # fmt: skip
def test_readiness(overrides: dict[str, object], ready: bool, problem: str | None) -> None:
    v = view_of(known_state(), **overrides)
    assert v.ready is ready
    assert sample(v, "kmq_tracker_ready") == (1 if ready else 0)
    if problem is not None:
        assert problem in v.problems()


def test_a_partition_still_replaying_is_not_ready() -> None:
    v = view_of(known_state(), replaying_state())
    assert not v.ready and v.problems() == ["replaying partitions [1]"]


def test_a_stalled_partition_is_a_gauge_and_not_ready() -> None:
    stall = Stall(after_s=30)
    stall.observe(0, 5, NOW - 45)
    assert stall.observe(0, 5, NOW - 10) is Change.STALLED
    v = replace(
        view_of(known_state()),
        partitions=(
            partition_view(known_state(), NOW),
            partition_view(replaying_state(), NOW, stall),
        ),
    )
    assert sample(v, "kmq_tracker_stalled_seconds", partition="1") == 45
    assert sample(v, "kmq_tracker_stalled_seconds", partition="0") == 0
    assert v.problems() == [
        "replaying partitions [1]",
        "markers partition 1: reading stalled for 45 s below the high watermark (a "
        "transaction the broker has not ended)",
    ]


def test_a_replica_with_no_partitions_is_a_ready_standby() -> None:
    assert view_of().ready


def test_broker_link_logs_once_when_lost_and_once_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kmq.tracker")
    link = BrokerLink("k:9092", grace_s=5.0)
    link.connected(0.0)
    for t in range(1, 20):  # a minute of failing rounds, coordinator gone
        link.begin_round()
        link.failed("KafkaConnectionError: socket disconnected", float(t))
        link.end_round(False, float(t))
    assert not link.up and link.problem == "KafkaConnectionError: socket disconnected"
    link.begin_round()
    link.end_round(False, 21.0)  # no error, but no coordinator yet: still down
    assert not link.up
    link.begin_round()
    link.end_round(True, 25.0)
    assert not link.up, "one clean round alone can be luck"
    link.begin_round()
    link.end_round(True, 26.0)
    assert link.up and link.problem == ""
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "connected to Kafka at k:9092",
        "lost Kafka at k:9092: KafkaConnectionError: socket disconnected; retrying, "
        "not ready until it is back",
        "Kafka at k:9092 is back after 25.0 s",
    ]


def test_a_coordinator_unknown_past_the_grace_counts_as_lost() -> None:
    link = BrokerLink("k:9092", grace_s=5.0)
    link.connected(0.0)
    for t in (1.0, 3.0, 4.5):  # a group forming: unknown for a moment is normal
        link.begin_round()
        link.end_round(False, t)
    assert link.up
    link.begin_round()
    link.end_round(False, 7.0)
    assert not link.up and "coordinator" in link.problem


def test_connect_delays_double_from_1_s_to_30_s() -> None:
    delays = reach.delays()
    assert [next(delays) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_until_reachable_says_each_cause_once(caplog: pytest.LogCaptureFixture) -> None:
    causes = iter(["refused", "refused", "refused", "TLS failed"])
    log = logging.getLogger("kmq.test")

    def attempt() -> None:
        cause = next(causes, None)
        if cause is None:
            return
        raise kmq.BrokerError(f"cannot connect to Kafka at h:1: {cause}")

    waits: list[float] = []

    class Clock(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            return False

    assert reach.until_reachable(attempt, log, Clock())
    assert waits == [1, 2, 4, 8]
    assert [r.getMessage() for r in caplog.records if r.name == "kmq.test"] == [
        "cannot connect to Kafka at h:1: refused; retrying in 1 s, then at most every 30 s",
        "cannot connect to Kafka at h:1: TLS failed; retrying in 8 s, then at most every 30 s",
    ]
    stopped = threading.Event()
    stopped.set()
    assert not reach.until_reachable(attempt, log, stopped)


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_probe_server_answers_metrics_healthz_and_readyz() -> None:
    current = [view_of(known_state(), replaying_state())]
    reg = registry(lambda: current[0])
    server = ProbeServer(0, lambda: current[0], reg, liveness_timeout_s=30, host="127.0.0.1")
    server.start()
    try:
        status, body = _get(server.port, "/metrics")
        assert status == 200
        assert b'kmq_tracker_in_flight_messages{partition="0"} 2.0' in body
        status, body = _get(server.port, "/readyz")
        assert status == 503
        assert json.loads(body) == {
            "ready": False, "problems": ["replaying partitions [1]"], "partitions": [0, 1],
        }  # fmt: skip
        assert _get(server.port, "/healthz")[0] == 200
        current[0] = view_of(known_state())
        assert _get(server.port, "/readyz")[0] == 200
        current[0] = view_of(known_state(), last_turn_age_s=31.0)
        status, body = _get(server.port, "/healthz")
        assert status == 503 and json.loads(body)["alive"] is False
        current[0] = view_of(connecting=True, broker_up=False, last_turn_age_s=99.0)
        assert _get(server.port, "/healthz")[0] == 200, "connecting (bounded retries) is alive"
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.close()


def test_json_log_lines_parse(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("json", "INFO")
        logging.getLogger("kmq.tracker").warning("lost Kafka at %s", "k:1")
        logging.getLogger("kafka.net").error("noise")  # kafka-python stays quiet
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        logging.getLogger("kafka").setLevel(logging.NOTSET)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert (record["level"], record["logger"], record["message"]) == (
        "warning", "kmq.tracker", "lost Kafka at k:1",
    )  # fmt: skip
