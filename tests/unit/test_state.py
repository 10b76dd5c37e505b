"""PartitionState, the tracker's pure core: scenario tables plus hypothesis properties."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kmq
from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.markers import (
    ENTRY,
    LANES,
    MAX_AFTER_MS,
    MAX_ATTEMPT,
    RETRY_LANE,
    Marker,
    MarkerType,
    check_entry,
    encode,
    encode_batch,
    encode_entries,
    parse,
)
from kmq.markers_v1 import encode_batch_v1, encode_v1
from kmq.records import delivery_key, fits_key
from tracker import state as state_module
from tracker.state import (
    MAX_HELD,
    PROBE_RETRY_S,
    YOUNG_S,
    Delivery,
    Due,
    PartitionState,
    floor_ms,
    share_budget,
)

PARTITION = 2
DEFAULT_LEASE_S = 30.0
LEASE_MS = 10_000
LEASE_S = LEASE_MS / 1000
ATTEMPT = 3
DELIVERY: Delivery = (0, 1, 40)
KEY = delivery_key(*DELIVERY)
MAX_LEASE_MS = int(MAX_REDELIVERY_TIMEOUT_S * 1000)

S, K, E, N, RD, RL, DL, RJ = (
    MarkerType.START,
    MarkerType.KEEPALIVE,
    MarkerType.END,
    MarkerType.NACK,
    MarkerType.REDELIVERED,
    MarkerType.RELEASE,
    MarkerType.DEAD_LETTERED,
    MarkerType.REJECT,
)


def make(
    kind: MarkerType,
    delivery: Delivery = DELIVERY,
    *,
    after_ms: int = LEASE_MS,
    attempt: int = ATTEMPT,
    reason: str = "",
    max_attempts: int = 0,
    dlq: str = "",
) -> Marker:
    lane, partition, offset = delivery
    start = kind is MarkerType.START
    return Marker(
        type=kind,
        lane=lane,
        partition=partition,
        offset=offset,
        attempt=attempt,
        redeliver_after_ms=after_ms,
        max_attempts=max_attempts,
        reason="" if start else reason,
        dead_letter_queue=dlq if start else "",
    )


def marker(
    kind: MarkerType,
    delivery: Delivery = DELIVERY,
    *,
    after_ms: int = LEASE_MS,
    attempt: int = ATTEMPT,
    reason: str = "",
    max_attempts: int = 0,
    dlq: str = "",
) -> bytes:
    """A version 2 marker record."""
    return encode(
        make(
            kind,
            delivery,
            after_ms=after_ms,
            attempt=attempt,
            reason=reason,
            max_attempts=max_attempts,
            dlq=dlq,
        )
    )


def marker_v1(
    kind: MarkerType,
    delivery: Delivery = DELIVERY,
    *,
    after_ms: int = LEASE_MS,
    attempt: int = ATTEMPT,
    reason: str = "",
) -> bytes:
    """A version 1 (protobuf) marker record, as kmq 0.1 wrote it; lane 0 only."""
    assert delivery[0] == 0
    start = kind is MarkerType.START
    return encode_v1(
        type=kind,
        queue="q",
        partition=delivery[1],
        offset=delivery[2],
        message_id=f"id-{delivery[1]}-{delivery[2]}",
        attempt=attempt,
        redeliver_after_ms=after_ms,
        key=b"q" if start else b"",
        value=b"payload" if start else b"",
        reason=reason,
    )


def caught_up(position: int = 0) -> PartitionState:
    """A state past its replay gate: everything read from now on is live."""
    state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S)
    state.set_position(position)
    state.set_end_offset(position)
    return state


def feed(state: PartitionState, value: bytes | None, now: float) -> int:
    """Append one record at the next offset; return its offset."""
    offset = state.position if state.position is not None else 0
    state.on_record(offset, value, now)
    return offset


def steps(dues: list[Due]) -> list[tuple[int, str]]:
    return [(d.attempt_step, d.reason) for d in dues]


# -- scenario table ---------------------------------------------------------------------------
# Each row: markers as (read time, bytes), the time due() is asked, and the expected
# (attempt_step, reason) of every due delivery. Which attempt the copy carries is decided
# later, from the re-read record (tracker.redeliver.copy_of).

EXPIRED = (1, "lease expired")
OTHER_OFFSET: Delivery = (0, 1, 41)
OTHER_LANE: Delivery = (RETRY_LANE, 1, 40)
OTHER_PARTITION: Delivery = (0, 2, 40)

V1_START = {
    "type": S,
    "partition": 1,
    "offset": 40,
    "message_id": "m",
    "redeliver_after_ms": LEASE_MS,
}

SCENARIOS: dict[str, tuple[list[tuple[float, bytes | None]], float, list[tuple[int, str]]]] = {
    "start-end": ([(0, marker(S)), (1, marker(E))], 10 * LEASE_S, []),
    "lease-not-yet-expired": ([(0, marker(S))], LEASE_S - 0.001, []),
    "lease-expired": ([(0, marker(S))], LEASE_S, [EXPIRED]),
    "keepalive-pushes-deadline": ([(0, marker(S)), (5, marker(K))], LEASE_S, []),
    "keepalive-then-expired": ([(0, marker(S)), (5, marker(K))], 5 + LEASE_S, [EXPIRED]),
    "keepalive-own-lease": (
        [(0, marker(S)), (5, marker(K, after_ms=2 * LEASE_MS))],
        5 + LEASE_S,
        [],
    ),
    "nack-before-delay": (
        [(0, marker(S)), (1, marker(N, after_ms=500, reason="boom"))],
        1.499,
        [],
    ),
    "nack-after-delay": (
        [(0, marker(S)), (1, marker(N, after_ms=500, reason="boom"))],
        1.5,
        [(1, "boom")],
    ),
    "nack-default-reason": ([(0, marker(S)), (1, marker(N, after_ms=0))], 1, [(1, "nacked")]),
    "nack-negative-delay-is-now-v1": (
        [(0, marker_v1(S)), (1, marker_v1(N, after_ms=-5))],
        1,
        [(1, "nacked")],
    ),
    "nack-huge-delay-capped": (
        [(0, marker(S)), (1, marker(N, after_ms=MAX_LEASE_MS + 1))],
        1 + MAX_REDELIVERY_TIMEOUT_S,
        [(1, "nacked")],
    ),
    "nack-huge-delay-not-before-the-cap": (
        [(0, marker(S)), (1, marker(N, after_ms=MAX_AFTER_MS))],
        1 + MAX_REDELIVERY_TIMEOUT_S - 0.001,
        [],
    ),
    "release-same-attempt": ([(0, marker(S)), (1, marker(RL))], 1, [(0, "released")]),
    "release-own-reason": (
        [(0, marker(S)), (1, marker(RL, reason="closing"))],
        1,
        [(0, "closing")],
    ),
    "nack-then-release": (
        [(0, marker(S)), (1, marker(N, after_ms=500)), (1.2, marker(RL))],
        1.2,
        [(0, "released")],
    ),
    "release-then-nack": (
        [(0, marker(S)), (1, marker(RL)), (1, marker(N, after_ms=500, reason="again"))],
        1.5,
        [(1, "again")],
    ),
    "redelivered-marker-drops": ([(0, marker(S)), (1, marker(RD))], 10 * LEASE_S, []),
    "dead-lettered-marker-drops": ([(0, marker(S)), (1, marker(DL))], 10 * LEASE_S, []),
    "end-of-other-offset": ([(0, marker(S)), (1, marker(E, OTHER_OFFSET))], LEASE_S, [EXPIRED]),
    "end-of-other-lane": ([(0, marker(S)), (1, marker(E, OTHER_LANE))], LEASE_S, [EXPIRED]),
    "end-of-other-partition": (
        [(0, marker(S)), (1, marker(E, OTHER_PARTITION))],
        LEASE_S,
        [EXPIRED],
    ),
    "retry-lane-delivery": ([(0, marker(S, OTHER_LANE))], LEASE_S, [EXPIRED]),
    "duplicate-start-later-lease": ([(0, marker(S)), (4, marker(S))], LEASE_S, []),
    "duplicate-start-one-redelivery": (
        [(0, marker(S)), (4, marker(S))],
        4 + LEASE_S,
        [EXPIRED],
    ),
    "duplicate-start-shorter-lease-keeps-the-longer": (
        [(0, marker(S)), (1, marker(S, after_ms=1000))],
        LEASE_S - 0.001,
        [],
    ),
    "attempt-zero-still-tracked": ([(0, marker(S, attempt=0))], LEASE_S, [EXPIRED]),
    "zero-lease-uses-default": ([(0, marker(S, after_ms=0))], LEASE_S, []),
    "zero-lease-default-expires": ([(0, marker(S, after_ms=0))], DEFAULT_LEASE_S, [EXPIRED]),
    "garbage-ignored": ([(0, marker(S)), (1, b"\xff\x00"), (2, None)], LEASE_S, [EXPIRED]),
    "v1-start-expires": ([(0, marker_v1(S))], LEASE_S, [EXPIRED]),
    "v1-start-v2-end": ([(0, marker_v1(S)), (1, marker(E))], 10 * LEASE_S, []),
    "v1-start-v2-nack": (
        [(0, marker_v1(S)), (1, marker(N, after_ms=0, reason="up"))],
        1,
        [(1, "up")],
    ),
    "v1-batch": (
        [(0, encode_batch_v1([V1_START, {**V1_START, "type": RL, "redeliver_after_ms": 0}]))],
        0,
        [(0, "released")],
    ),
    "reject-now": ([(0, marker(S)), (1, marker(RJ))], 1, [(1, "rejected")]),
    "reject-own-reason": ([(0, marker(S)), (1, marker(RJ, reason="poison"))], 1, [(1, "poison")]),
    "reject-not-before-it-is-read": ([(0, marker(S)), (1, marker(RJ))], 0.999, []),
    "reject-ignores-its-after-ms": (
        [(0, marker(S)), (1, marker(RJ, after_ms=MAX_LEASE_MS))],
        1,
        [(1, "rejected")],
    ),
    "reject-overrides-a-nack-delay": (
        [(0, marker(S)), (1, marker(N, after_ms=60_000, reason="later")), (2, marker(RJ))],
        2,
        [(1, "rejected")],
    ),
    "release-then-reject": (
        [(0, marker(S)), (1, marker(RL)), (1, marker(RJ))],
        1,
        [(1, "rejected")],
    ),
    "reject-then-end": ([(0, marker(S)), (1, marker(RJ)), (1, marker(E))], 10 * LEASE_S, []),
    "reject-of-other-delivery": ([(0, marker(S)), (1, marker(RJ, OTHER_OFFSET))], 1, []),
    "batch-start-and-end": ([(0, encode_batch([make(S), make(E)]))], 10 * LEASE_S, []),
    "batch-two-starts": (
        [(0, encode_batch([make(S), make(S, OTHER_OFFSET)]))],
        LEASE_S,
        [EXPIRED, EXPIRED],
    ),
}


@pytest.mark.parametrize(("records", "at", "expected"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenarios(
    records: list[tuple[float, bytes | None]], at: float, expected: list[tuple[int, str]]
) -> None:
    state = caught_up()
    for now, value in records:
        feed(state, value, now)
    assert steps(state.due(at)) == expected


def test_due_names_the_record_and_carries_the_start_settings() -> None:
    state = caught_up(position=5)
    start = feed(state, marker(S, max_attempts=4, dlq="custom.dlq"), 0)
    [due] = state.due(LEASE_S)
    assert due == Due(
        marker_partition=PARTITION,
        key=KEY,
        start_offset=start,
        attempt_step=1,
        reason="lease expired",
        max_attempts=4,
        dead_letter_queue="custom.dlq",
    )
    assert due.delivery == DELIVERY
    assert state.due(100 * LEASE_S) == [], "a due delivery is handed out once"


def test_retry_lane_due_names_the_retry_record() -> None:
    state = caught_up()
    feed(state, marker(S, OTHER_LANE), 0)
    [due] = state.due(LEASE_S)
    assert due.delivery == OTHER_LANE and due.key == delivery_key(*OTHER_LANE) != KEY
    assert state.deliveries() == [OTHER_LANE]


def test_dead_letter_queue_is_the_first_starts_and_forgotten_with_the_delivery() -> None:
    state = caught_up()
    feed(state, marker(S, dlq="first"), 0)
    feed(state, marker(S, dlq="second"), 0)
    [due] = state.due(LEASE_S)
    assert due.dead_letter_queue == "first"
    state.redelivered(due.key)
    feed(state, marker(S), LEASE_S)
    [again] = state.due(2 * LEASE_S)
    assert again.dead_letter_queue == "", "the default <queue>.dlq"


def test_discard_forgets_a_delivery_and_counts_why() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    state.discard(due.key, "record_gone")
    assert state.in_flight == 0 and state.stats["record_gone"] == 1
    assert state.stats["redeliveries"] == 0
    state.discard(due.key, "record_gone")
    assert state.stats["record_gone"] == 1, "counted once"


def test_redelivered_drops_the_entry_and_advances_commit() -> None:
    state = caught_up(position=7)
    start = feed(state, marker(S), 0)
    assert state.commit_offset() == start
    [due] = state.due(LEASE_S)
    assert state.commit_offset() == start, "still in flight while being redelivered"
    state.redelivered(due.key)
    assert state.in_flight == 0
    assert state.next_deadline() is None
    assert state.commit_offset() == state.position == start + 1
    state.redelivered(due.key)  # a second report is harmless
    assert state.in_flight == 0
    assert (state.stats["redeliveries"], state.stats["dead_letters"]) == (1, 0)


def test_dead_lettered_is_counted_apart() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    state.redelivered(due.key, dead_lettered=True)
    assert (state.stats["redeliveries"], state.stats["dead_letters"]) == (0, 1)
    assert state.in_flight == 0


def test_redelivery_failed_reschedules() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [first] = state.due(LEASE_S)
    state.redelivery_failed(first.key, now=LEASE_S, retry_after_s=2)
    assert state.next_deadline() == LEASE_S + 2
    assert state.due(LEASE_S + 1.999) == []
    assert state.due(LEASE_S + 2) == [first]
    assert state.stats["redelivery_failed"] == 1


def test_redelivery_failed_is_ignored_unless_redelivering() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    state.redelivery_failed(KEY, now=0, retry_after_s=1)
    state.postpone(KEY, until=1)
    assert state.next_deadline() == LEASE_S
    assert state.stats["redelivery_failed"] == state.stats["postponed"] == 0


def test_postpone_holds_a_due_delivery() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    state.postpone(due.key, until=LEASE_S + 60, why="paused")
    assert state.stats["paused"] == 1
    assert state.next_deadline() == LEASE_S + 60
    assert state.due(LEASE_S + 59.999) == []
    assert state.due(LEASE_S + 60) == [due]


def test_markers_while_redelivering_are_late() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    for kind in (K, N, RL):
        feed(state, marker(kind), LEASE_S)
    assert state.stats["late_marker"] == 3
    assert state.next_deadline() is None, "nothing rescheduled behind the redelivery's back"
    state.redelivery_failed(due.key, LEASE_S, 1)
    [again] = state.due(LEASE_S + 1)
    assert (again.attempt_step, again.reason) == EXPIRED, "late markers changed nothing"
    state.redelivered(again.key)
    assert state.in_flight == 0


@pytest.mark.parametrize("start_max_attempts", [0, 1, 9])
def test_reject_dead_letters_whatever_the_start_allowed(start_max_attempts: int) -> None:
    state = caught_up()
    start = feed(state, marker(S, max_attempts=start_max_attempts, dlq="parking"), 0)
    feed(state, marker(RJ, reason="bad"), 1)
    [due] = state.due(1)
    assert due == Due(
        marker_partition=PARTITION,
        key=KEY,
        start_offset=start,
        attempt_step=1,
        reason="bad",
        max_attempts=1,
        dead_letter_queue="parking",
    )
    assert state.stats["reject"] == 1


def test_reject_while_redelivering_is_late() -> None:
    state = caught_up()
    feed(state, marker(S, max_attempts=5), 0)
    [due] = state.due(LEASE_S)
    feed(state, marker(RJ), LEASE_S)
    assert state.stats["late_marker"] == 1
    state.redelivery_failed(due.key, LEASE_S, 1)
    [again] = state.due(LEASE_S + 1)
    assert (again.max_attempts, again.reason) == (5, "lease expired"), "the reject came late"


def test_end_while_redelivering_drops_it() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    feed(state, marker(E), LEASE_S)
    assert state.in_flight == 0
    state.redelivery_failed(due.key, LEASE_S, 1)
    assert state.next_deadline() is None and state.due(1e9) == []


def test_keepalive_moves_next_deadline() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    feed(state, marker(K), 3)
    assert state.next_deadline() == 3 + LEASE_S


def test_replay_gate() -> None:
    state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S)
    state.set_position(0)
    feed(state, marker(S), 0)
    assert state.replaying and state.due(100 * LEASE_S) == [], "end offset unknown"
    state.set_end_offset(3)
    state.set_end_offset(1)  # later calls are ignored
    assert state.end_offset == 3
    feed(state, marker(K, OTHER_OFFSET), 1)
    assert state.replaying and state.due(100 * LEASE_S) == [], "position < end offset"
    feed(state, marker(E, OTHER_OFFSET), 2)
    assert not state.replaying
    assert [d.delivery for d in state.due(100 * LEASE_S)] == [DELIVERY]


def test_replaying_until_a_position_is_known() -> None:
    state = PartitionState(PARTITION)
    state.set_end_offset(0)
    assert state.replaying
    state.set_position(0)
    assert not state.replaying


def test_set_position_only_once() -> None:
    state = caught_up(position=5)
    state.set_position(9)
    assert state.position == 5
    assert state.commit_offset() == 5


def test_commit_offset_is_oldest_in_flight_start() -> None:
    state = caught_up(position=100)
    a = feed(state, marker(S, (0, 0, 1)), 0)
    b = feed(state, marker(S, (0, 0, 2)), 0)
    feed(state, marker(S, (0, 0, 3)), 0)
    assert state.commit_offset() == a
    feed(state, marker(E, (0, 0, 2)), 1)
    assert state.commit_offset() == a
    feed(state, marker(E, (0, 0, 1)), 1)
    assert state.commit_offset() == b + 1
    feed(state, marker(E, (0, 0, 3)), 1)
    assert state.commit_offset() == state.position
    assert state.in_flight == 0


def test_commit_offset_counts_settled_starts_sharing_a_record() -> None:
    state = caught_up(position=10)
    shared = feed(state, encode_batch([make(S, (0, 0, 1)), make(S, (0, 0, 2))]), 0)
    alone = feed(state, marker(S, (0, 0, 3)), 0)
    assert state.stats["batch"] == 1
    assert state.commit_offset() == shared
    assert state.commit_offset([shared]) == shared, "the other START there is in flight"
    assert state.commit_offset([shared, shared]) == alone
    assert state.commit_offset([shared, shared, alone]) == state.position
    assert state.commit_offset([alone]) == shared
    feed(state, marker(E, (0, 0, 1)), 1)
    assert state.commit_offset() == shared
    feed(state, marker(E, (0, 0, 2)), 1)
    assert state.commit_offset() == alone


def test_commit_offset_unknown_before_any_position() -> None:
    assert PartitionState(PARTITION).commit_offset() is None


def test_duplicate_start_keeps_one_entry_and_earliest_offset() -> None:
    state = caught_up()
    first = feed(state, marker(S), 0)
    feed(state, marker(S, attempt=ATTEMPT + 5, max_attempts=9), 1)
    assert state.in_flight == 1
    assert state.deliveries() == [DELIVERY]
    assert state.commit_offset() == first
    assert state.stats["duplicate_start"] == 1
    [due] = state.due(1 + LEASE_S)
    assert (due.start_offset, due.max_attempts) == (first, 0)
    feed(state, marker(E), 2)
    assert state.in_flight == 0


def test_duplicate_start_after_redelivery_creates_fresh_entry() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    state.redelivered(due.key)
    again = feed(state, marker(S), LEASE_S + 1)
    assert state.in_flight == 1
    assert state.commit_offset() == again
    assert steps(state.due(2 * LEASE_S + 1)) == [EXPIRED]


def test_duplicate_start_while_redelivering_changes_nothing() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    feed(state, marker(S), LEASE_S)
    assert state.stats["duplicate_start"] == 1
    assert state.next_deadline() is None
    state.redelivered(due.key)
    assert state.in_flight == 0


def test_attempt_zero_is_counted() -> None:
    state = caught_up()
    feed(state, marker(S, attempt=0), 0)
    assert state.stats["bad_attempt"] == 1 and state.in_flight == 1


@pytest.mark.parametrize("kind", [K, E, N, RL, RD, DL, RJ])
def test_marker_for_unknown_delivery_is_counted_and_ignored(kind: MarkerType) -> None:
    state = caught_up()
    feed(state, marker(kind), 0)
    assert state.stats["unknown_delivery"] == 1
    assert state.stats[kind.name.lower()] == 1
    assert state.in_flight == 0
    assert state.commit_offset() == state.position == 1


# -- bad markers --------------------------------------------------------------------------------


def record(*entries: tuple[int, ...], texts: bytes = b"", count: int | None = None) -> bytes:
    """A version 2 record from raw entry fields, bypassing the codec's checks."""
    n = len(entries) if count is None else count
    return b"\x02" + struct.pack(">I", n) + b"".join(ENTRY.pack(*e) for e in entries) + texts


GOOD = (int(S), 0, 1, 40, 1, LEASE_MS, 0, 0)


def with_(index: int, value: int) -> tuple[int, ...]:
    fields = list(GOOD)
    fields[index] = value
    return tuple(fields)


BAD_MARKERS: dict[str, tuple[bytes | None, str]] = {
    "none": (None, "no value"),
    "empty": (b"", "version 0"),
    "junk": (b"\xff\xfe\xfd", "protobuf"),
    "text": (b"not a marker at all", "protobuf"),
    "v2-wrong-version-byte": (b"\x03" + record(GOOD)[1:], "protobuf"),
    "v2-truncated": (record(GOOD)[:-1], "cannot hold 1"),
    "v2-header-only": (b"\x02\x00\x00", "too short"),
    "v2-count-zero": (record(count=0), "cannot hold 0"),
    "v2-count-too-big": (record(GOOD, count=2), "cannot hold 2"),
    "v2-unknown-type-0": (record(with_(0, 0)), "unknown marker type 0"),
    "v2-unknown-type-99": (record(with_(0, 99)), "unknown marker type 99"),
    "v2-unknown-lane": (record(with_(1, 2)), "unknown lane 2"),
    "v2-negative-partition": (record(with_(2, -1)), "-1:40"),
    "v2-negative-offset": (record(with_(3, -1)), "1:-1"),
    "v2-partition-beyond-keys": (record(with_(2, 2**15)), "impossible record"),
    "v2-offset-beyond-keys": (record(with_(3, 2**44)), "impossible record"),
    "v2-text-missing": (record(with_(7, 3)), "texts"),
    "v2-text-too-short": (record(with_(7, 3), texts=b"ab"), "texts"),
    "v2-text-too-long": (record(with_(7, 3), texts=b"abcd"), "texts"),
    "v2-trailing-bytes": (record(GOOD, texts=b"x"), "texts"),
    "v1-version-2": (encode_v1(version=2, type=S, message_id="m"), "version 2"),
    "v1-type-99": (encode_v1(type=99, message_id="m"), "type 99"),
    "v1-no-message-id": (encode_v1(type=S, partition=1, offset=40), "message id"),
    "v1-negative-partition": (encode_v1(type=S, partition=-1, message_id="m"), "-1:0"),
}


def problem(value: bytes | None) -> str:
    """Why the tracker must skip this record: the codec's complaint."""
    try:
        entries, _ = parse(value)
    except kmq.MarkerDecodeError as exc:
        return str(exc)
    [entry] = entries
    found = check_entry(entry)
    if found is None and not fits_key(entry[2], entry[3]):
        return "impossible record"
    assert found is not None
    return found


@pytest.mark.parametrize(("value", "complaint"), BAD_MARKERS.values(), ids=BAD_MARKERS.keys())
def test_bad_marker_samples_really_are_bad(value: bytes | None, complaint: str) -> None:
    assert complaint in problem(value)


@pytest.mark.parametrize("value", [v for v, _ in BAD_MARKERS.values()], ids=BAD_MARKERS.keys())
def test_bad_marker_is_counted_and_skipped(value: bytes | None) -> None:
    state = caught_up()
    feed(state, value, 0)
    assert state.stats["bad_marker"] == 1
    assert state.in_flight == 0
    assert state.position == 1, "the bad record is consumed"
    assert state.due(100 * LEASE_S) == []


def test_bad_entries_of_a_batch_are_skipped_one_by_one() -> None:
    state = caught_up()
    feed(state, record(with_(0, 99), GOOD, with_(1, 7), with_(2, 2**15)), 0)
    assert state.stats["bad_marker"] == 3
    assert state.deliveries() == [DELIVERY]


ABSURD_LEASES = [
    (marker, 0),
    (marker, MAX_LEASE_MS + 1),
    (marker, MAX_AFTER_MS),
    (marker_v1, 0),
    (marker_v1, -1),
    (marker_v1, -(2**63)),
    (marker_v1, MAX_LEASE_MS + 1),
    (marker_v1, 2**63 - 1),
]


@pytest.mark.parametrize(("encoder", "after_ms"), ABSURD_LEASES)
@pytest.mark.parametrize("kind", [S, K])
def test_absurd_lease_falls_back_to_default(
    encoder: Callable[..., bytes], after_ms: int, kind: MarkerType
) -> None:
    state = caught_up()
    feed(state, encoder(S, after_ms=after_ms if kind is S else LEASE_MS), 0)
    if kind is K:
        feed(state, encoder(K, after_ms=after_ms), 0)
    assert state.next_deadline() == DEFAULT_LEASE_S
    assert state.stats["bad_lease"] == 1


def test_longest_lease_is_accepted() -> None:
    state = caught_up()
    feed(state, marker(S, after_ms=MAX_LEASE_MS), 0)
    assert state.next_deadline() == MAX_REDELIVERY_TIMEOUT_S
    assert state.stats["bad_lease"] == 0


def test_records_below_position_are_ignored() -> None:
    state = caught_up(position=10)
    state.on_record(3, marker(S), 0)
    assert state.in_flight == 0
    start = feed(state, marker(S), 0)
    state.on_record(start, marker(E), 1)  # re-read of an offset already consumed
    assert state.in_flight == 1
    assert state.position == start + 1
    assert state.stats["reread"] == 2


def test_due_respects_limit_and_deadline_order() -> None:
    state = caught_up()
    for i, lease_ms in enumerate([3000, 1000, 2000]):
        feed(state, marker(S, (0, 0, i), after_ms=lease_ms), 0)
    first = state.due(10, limit=2)
    assert [d.delivery for d in first] == [(0, 0, 1), (0, 0, 2)]
    assert [d.delivery for d in state.due(10)] == [(0, 0, 0)]


def test_due_deadlines_peek_at_what_due_takes_without_taking_it() -> None:
    state = caught_up()
    for i, lease_ms in enumerate([3000, 1000, 2000]):
        feed(state, marker(S, (0, 0, i), after_ms=lease_ms), 0)
    assert state.due_deadlines(2.5, limit=5) == [1.0, 2.0]
    assert state.due_deadlines(10, limit=2) == [1.0, 2.0]
    assert [d.delivery for d in state.due(10, limit=2)] == [(0, 0, 1), (0, 0, 2)]
    assert state.due_deadlines(10) == [3.0]
    assert state.due_deadlines(2.9) == []


def test_due_deadlines_are_empty_while_replaying() -> None:
    state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S)
    state.set_position(0)
    state.set_end_offset(5)  # the replay gate: closed until offset 5 is read
    feed(state, marker(S, after_ms=1000), 0)
    assert state.replaying
    assert state.due_deadlines(10) == [] == state.due(10)


@pytest.mark.parametrize(
    ("deadlines", "budget", "shares"),
    [
        ({}, 10, {}),
        ({0: [1.0, 2.0], 1: []}, 10, {0: 2}),
        # Partition 0 first in order, but partition 1's deadlines are older.
        ({0: [5.0, 6.0, 7.0], 1: [1.0, 2.0]}, 3, {1: 2, 0: 1}),
        ({0: [1.0, 3.0, 5.0], 1: [2.0, 4.0, 6.0]}, 4, {0: 2, 1: 2}),
        ({0: [1.0], 1: [1.0]}, 0, {}),
    ],
)
def test_share_budget_takes_the_oldest_deadlines_of_all_partitions(
    deadlines: dict[int, list[float]], budget: int, shares: dict[int, int]
) -> None:
    assert share_budget(deadlines, budget) == shares


@given(
    st.dictionaries(
        st.integers(0, 7),
        st.lists(st.floats(0, 100, allow_nan=False)).map(sorted),
        max_size=8,
    ),
    st.integers(0, 50),
)
def test_share_budget_leaves_no_deadline_older_than_one_it_takes(
    deadlines: dict[int, list[float]], budget: int
) -> None:
    shares = share_budget(deadlines, budget)
    total = sum(map(len, deadlines.values()))
    assert sum(shares.values()) == min(budget, total)
    taken = [d for p, ds in deadlines.items() for d in ds[: shares.get(p, 0)]]
    left = [d for p, ds in deadlines.items() for d in ds[shares.get(p, 0) :]]
    assert all(0 < n <= len(deadlines[p]) for p, n in shares.items())
    if taken and left:
        assert max(taken) <= min(left)


# -- hypothesis ------------------------------------------------------------------------------

DELIVERIES: list[Delivery] = [(0, 0, 100), (0, 0, 101), (RETRY_LANE, 0, 100), (0, 1, 100)]
LEASES_MS = st.sampled_from(
    [1, 500, LEASE_MS, 60_000, MAX_LEASE_MS, 0, MAX_LEASE_MS + 1, MAX_AFTER_MS]
)
REASONS = st.sampled_from(["", "boom", "é"])
RETRY_S = 1.5


def effective_lease_s(after_ms: int) -> float:
    """The documented rule: leases outside (0, 12 h] fall back to the default."""
    return after_ms / 1000 if 0 < after_ms <= MAX_LEASE_MS else DEFAULT_LEASE_S


def effective_delay_s(after_ms: int) -> float:
    """A NACK's delay: within [0, 12 h], capped at 12 h."""
    return min(max(after_ms, 0), MAX_LEASE_MS) / 1000


@dataclass
class Tracked:
    """What the spec says about one in-flight delivery."""

    start_offset: int
    not_before: float
    max_attempts: int
    dead_letter_queue: str
    attempt_step: int = 1
    reason: str = "lease expired"
    redelivering: bool = False


@dataclass
class Model:
    tracked: dict[Delivery, Tracked] = field(default_factory=dict)
    ended: set[Delivery] = field(default_factory=set)


markers_st = st.builds(
    make,
    st.sampled_from(list(MarkerType)),
    st.sampled_from(DELIVERIES),
    after_ms=LEASES_MS,
    attempt=st.integers(0, 5),
    reason=REASONS,
    max_attempts=st.integers(0, 4),
    dlq=st.sampled_from(["", "elsewhere"]),
)


class PartitionStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S)
        self.model = Model()
        self.now = 0.0
        self.pending: list[Delivery] = []

    @initialize(start=st.integers(0, 3), backlog=st.integers(0, 6))
    def assign(self, start: int, backlog: int) -> None:
        self.state.set_position(start)
        self.state.set_end_offset(start + backlog)

    def _feed(self, value: bytes | None) -> int:
        return feed(self.state, value, self.now)

    def _expect(self, m: Marker, offset: int) -> None:
        """What the spec says one marker read at ``offset`` does."""
        if m.type is MarkerType.PROBE:
            return  # this state writes no probes: another tracker's, which changes nothing
        d = (m.lane, m.partition, m.offset)
        t = self.model.tracked.get(d)
        if m.type is S:
            deadline = self.now + effective_lease_s(m.redeliver_after_ms)
            if t is None:
                self.model.tracked[d] = Tracked(
                    offset, deadline, m.max_attempts, m.dead_letter_queue
                )
                self.model.ended.discard(d)
            elif not t.redelivering:
                t.not_before = max(t.not_before, deadline)
            return
        if t is None:
            return
        if m.type in (E, RD, DL):
            del self.model.tracked[d]
            self.model.ended.add(d)
        elif t.redelivering:
            pass  # late: changes nothing
        elif m.type is K:
            t.not_before = self.now + effective_lease_s(m.redeliver_after_ms)
        elif m.type is N:
            t.attempt_step, t.reason = 1, m.reason or "nacked"
            t.not_before = self.now + effective_delay_s(m.redeliver_after_ms)
        elif m.type is RL:
            t.attempt_step, t.reason = 0, m.reason or "released"
            t.not_before = self.now
        elif m.type is MarkerType.REJECT:  # dead-lettered now, whatever its attempt
            t.attempt_step, t.max_attempts, t.reason = 1, 1, m.reason or "rejected"
            t.not_before = self.now

    @rule(m=markers_st)
    def one_marker(self, m: Marker) -> None:
        self._expect(m, self._feed(encode(m)))

    @rule(ms=st.lists(markers_st, min_size=2, max_size=5))
    def batch(self, ms: list[Marker]) -> None:
        offset = self._feed(encode_batch(ms))
        for m in ms:
            self._expect(m, offset)

    @rule(
        kind=st.sampled_from([S, K, N, RL, E]),
        d=st.sampled_from([d for d in DELIVERIES if d[0] == 0]),
        after_ms=st.one_of(LEASES_MS, st.sampled_from([-1, -(2**63), 2**63 - 1])),
        reason=REASONS,
    )
    def old_marker(self, kind: MarkerType, d: Delivery, after_ms: int, reason: str) -> None:
        """A version 1 marker: read as its version 2 twin (after clamped to a uint32)."""
        offset = self._feed(marker_v1(kind, d, after_ms=after_ms, reason=reason))
        twin = make(kind, d, after_ms=min(max(after_ms, 0), MAX_AFTER_MS), reason=reason)
        self._expect(twin, offset)

    @rule(data=st.binary(max_size=40))
    def garbage(self, data: bytes) -> None:
        try:
            parse(data)
        except kmq.MarkerDecodeError:
            before = self.state.in_flight
            self._feed(data)
            assert self.state.in_flight == before

    @rule()
    def null_record(self) -> None:
        self._feed(None)

    @precondition(lambda self: (self.state.position or 0) > 0)
    @rule(back=st.integers(1, 5), m=markers_st)
    def reread(self, back: int, m: Marker) -> None:
        position = self.state.position
        assert position is not None
        before = (self.state.in_flight, self.state.commit_offset(), self.state.next_deadline())
        self.state.on_record(max(0, position - back), encode(m), self.now)
        after = (self.state.in_flight, self.state.commit_offset(), self.state.next_deadline())
        assert after == before
        assert self.state.position == position

    @rule(dt=st.one_of(st.floats(0, 5), st.sampled_from([LEASE_S, DEFAULT_LEASE_S])))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(limit=st.integers(1, 4))
    def poll(self, limit: int) -> None:
        self._poll(limit)

    def _poll(self, limit: int) -> list[Due]:
        """Ask for due deliveries, check each against the model and mark it redelivering."""
        dues = self.state.due(self.now, limit)
        assert len(dues) <= limit
        if self.state.replaying:
            assert dues == []
        for due in dues:
            d = due.delivery
            assert d not in self.model.ended, f"{d} was settled, then redelivered"
            t = self.model.tracked[d]
            assert not t.redelivering
            assert self.now >= t.not_before, f"{d} due at {self.now} before {t.not_before}"
            assert due.marker_partition == PARTITION
            assert due.key == delivery_key(*d)
            assert due.start_offset == t.start_offset
            assert (due.attempt_step, due.reason) == (t.attempt_step, t.reason)
            assert (due.max_attempts, due.dead_letter_queue) == (
                t.max_attempts,
                t.dead_letter_queue,
            )
            t.redelivering = True
            self.pending.append(d)
        return dues

    @precondition(lambda self: self.pending)
    @rule(
        i=st.integers(0, 10),
        outcome=st.sampled_from(["redelivered", "dead_lettered", "failed", "postponed", "gone"]),
    )
    def settle(self, i: int, outcome: str) -> None:
        d = self.pending.pop(i % len(self.pending))
        key = delivery_key(*d)
        t = self.model.tracked.get(d)
        if outcome in ("redelivered", "dead_lettered", "gone"):
            if outcome == "gone":
                self.state.discard(key, "record_gone")
            else:
                self.state.redelivered(key, dead_lettered=outcome == "dead_lettered")
            # As for a failure below: after END and a fresh START, the outcome of the
            # stale redelivery does not touch the new entry.
            if t is not None and t.redelivering:
                del self.model.tracked[d]
                self.model.ended.add(d)
            return
        retry_at = self.now + (RETRY_S if outcome == "failed" else 4 * RETRY_S)
        if outcome == "failed":
            self.state.redelivery_failed(key, self.now, RETRY_S)
        else:
            self.state.postpone(key, retry_at)
        # Only an entry still being redelivered is rescheduled: after END and a fresh
        # START, the failure of the stale redelivery does not touch the new entry.
        if t is not None and t.redelivering:
            t.redelivering = False
            t.not_before = retry_at

    @invariant()
    def in_flight_matches_model(self) -> None:
        assert self.state.in_flight == len(self.model.tracked)
        assert set(self.state.deliveries()) == set(self.model.tracked)

    @invariant()
    def commit_never_passes_an_in_flight_start(self) -> None:
        commit = self.state.commit_offset()
        position = self.state.position
        assert commit is not None and position is not None
        assert commit <= position
        for t in self.model.tracked.values():
            assert commit <= t.start_offset
        # Counting the deliveries being redelivered as settled skips only their STARTs.
        redelivering = [t.start_offset for t in self.model.tracked.values() if t.redelivering]
        waiting = [t.start_offset for t in self.model.tracked.values() if not t.redelivering]
        past = self.state.commit_offset(redelivering)
        assert past is not None and commit <= past <= position
        assert all(past <= s for s in waiting)
        if not waiting:
            assert past == position

    @invariant()
    def nothing_scheduled_before_its_deadline(self) -> None:
        deadline = self.state.next_deadline()
        waiting = [t.not_before for t in self.model.tracked.values() if not t.redelivering]
        assert (deadline is None) == (not waiting)
        if deadline is not None:
            assert deadline >= min(waiting)

    @invariant()
    def empty_when_everything_ended(self) -> None:
        if not self.model.tracked:
            assert self.state.in_flight == 0
            assert self.state.next_deadline() is None
            assert self.state.commit_offset() == self.state.position


TestPartitionStateMachine = PartitionStateMachine.TestCase
TestPartitionStateMachine.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)


record_values = st.one_of(
    st.none(),
    st.binary(max_size=60),
    markers_st.map(encode),
    st.lists(markers_st, min_size=1, max_size=4).map(encode_batch),
    st.builds(
        marker_v1,
        st.sampled_from(list(MarkerType)),
        st.sampled_from([d for d in DELIVERIES if d[0] == 0]),
        after_ms=st.integers(-(2**63), 2**63 - 1),
        attempt=st.integers(0, MAX_ATTEMPT),
    ),
    st.lists(
        st.tuples(
            st.integers(0, 255),
            st.integers(0, 255),
            st.integers(-(2**31), 2**31 - 1),
            st.integers(-(2**63), 2**63 - 1),
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**32 - 1),
            st.just(0),
        ),
        min_size=1,
        max_size=3,
    ).map(lambda entries: encode_entries(entries, [])),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-2, 3), record_values, st.floats(0, 1e6, allow_nan=False)),
        max_size=40,
    )
)
def test_any_record_sequence_never_raises(
    records: list[tuple[int, bytes | None, float]],
) -> None:
    state = caught_up()
    now = 0.0
    for step, value, dt in records:
        now += dt
        offset = (state.position or 0) + step  # gaps and re-reads included
        state.on_record(max(0, offset), value, now)
        for due in state.due(now):
            lane, partition, record_offset = due.delivery
            assert lane in LANES and fits_key(partition, record_offset)
            assert due.attempt_step in (0, 1) and due.reason
            assert 0 <= due.max_attempts <= MAX_ATTEMPT
            if step % 2:
                state.redelivered(due.key)
            else:
                state.redelivery_failed(due.key, now, RETRY_S)
        commit = state.commit_offset()
        assert commit is not None and state.position is not None
        assert commit <= state.position
        assert state.in_flight == len(state.deliveries())


# -- probes: acting on a deadline only once the log has been read past it ----------------------

NONCE = 0xC0FFEE
OTHER_NONCE = NONCE + 1
P = MarkerType.PROBE
MINUS_INF = float("-inf")


def probing(position: int = 0, *, young_s: float = YOUNG_S) -> PartitionState:
    """A caught-up state that writes probes (as the daemon's are)."""
    state = PartitionState(
        PARTITION, default_lease_s=DEFAULT_LEASE_S, young_s=young_s, probe_nonce=NONCE
    )
    state.set_position(position)
    state.set_end_offset(position)
    return state


def probe_record(sent_ms: int, nonce: int = NONCE) -> bytes:
    return encode_entries([(int(P), 0, PARTITION, sent_ms, nonce, 0, 0, 0)], [])


@dataclass(frozen=True)
class Step:
    """``marker``: read ``value`` at ``at``; ``probe``: write a probe at ``at`` (it waits in
    the log); ``read``: read the oldest probe written and not read yet at ``at``;
    ``foreign``: read another tracker's probe, sent at ``sent_ms`` by its clock."""

    kind: str
    at: float
    value: bytes | None = None
    sent_ms: int = 0


def at(t: float, value: bytes) -> Step:
    return Step("marker", t, value)


def probe_at(t: float) -> Step:
    return Step("probe", t)


def read_at(t: float) -> Step:
    return Step("read", t)


def foreign_at(t: float, sent_ms: int) -> Step:
    return Step("foreign", t, sent_ms=sent_ms)


def run(state: PartitionState, script: list[Step]) -> None:
    log: list[bytes] = []
    for step in script:
        if step.kind == "marker":
            feed(state, step.value, step.at)
        elif step.kind == "probe":
            log.append(encode_entries([state.probe(step.at)], []))
        elif step.kind == "read":
            feed(state, log.pop(0), step.at)
        else:
            feed(state, probe_record(step.sent_ms, OTHER_NONCE), step.at)


LATER: Delivery = OTHER_OFFSET
RETRY_AT = 10 + PROBE_RETRY_S

# Each row: the script, when due() is asked, the (attempt_step, reason) of what is due then,
# whether a probe is needed after that, and the horizon.
PROBE_SCENARIOS: dict[
    str, tuple[list[Step], float, list[tuple[int, str]], bool, float]
] = {
    "nothing-in-flight": ([], 100, [], False, MINUS_INF),
    "deadline-not-passed": ([at(0, marker(S))], LEASE_S - 0.001, [], False, MINUS_INF),
    "the-clock-alone-is-not-enough": ([at(0, marker(S))], LEASE_S, [], True, MINUS_INF),
    "own-probe-read-back": (
        [at(0, marker(S)), probe_at(10), read_at(10.2)], 10.2, [EXPIRED], False, 10.0),
    "read-back-much-later": (
        [at(0, marker(S)), probe_at(10), read_at(50)], 50, [EXPIRED], False, 10.0),
    "a-probe-before-the-deadline-proves-nothing": (
        [at(0, marker(S)), probe_at(9.999), read_at(10)], 10, [], True, 9.999),
    "probe-outstanding": ([at(0, marker(S)), probe_at(10)], 10.5, [], False, MINUS_INF),
    "outstanding-just-before-the-retry": (
        [at(0, marker(S)), probe_at(10)], RETRY_AT - 0.001, [], False, MINUS_INF),
    "a-probe-not-read-back-is-sent-again": (
        [at(0, marker(S)), probe_at(10)], RETRY_AT, [], True, MINUS_INF),
    "foreign-probe-while-one-is-outstanding": (
        [at(0, marker(S)), probe_at(10), foreign_at(10.2, 20_000)], 10.5, [], False, MINUS_INF),
    "foreign-probe-answers-nothing": (
        [at(0, marker(S)), foreign_at(10.2, 20_000)], 10.5, [], True, MINUS_INF),
    "a-newer-deadline-than-the-outstanding-probe": (
        [at(0, marker(S)), at(0, marker(S, LATER, after_ms=10_500)), probe_at(10),
         at(10.1, marker(E))],
        10.6, [], True, MINUS_INF),
    "the-outstanding-probe-covers-the-first-deadline": (
        [at(0, marker(S)), at(0, marker(S, LATER, after_ms=10_500)), probe_at(10)],
        10.6, [], False, MINUS_INF),
    "a-probe-covers-only-older-deadlines": (
        [at(0, marker(S)), at(0, marker(S, LATER, after_ms=12_000)), probe_at(10),
         read_at(12.5)],
        12.5, [EXPIRED], True, 10.0),
    "the-horizon-does-not-cover-later-starts": (
        [at(0, marker(S)), probe_at(10), read_at(10.1), at(10.1, marker(S, LATER))],
        25, [EXPIRED], True, 10.0),
    "send-time-rounded-down-to-the-ms": (
        [at(0.0004, marker(S)), probe_at(10.0009), read_at(10.001)], 10.001, [], True, 10.0),
    "newest-own-probe-wins": (
        [at(0, marker(S)), probe_at(10), probe_at(11), read_at(11), read_at(11.2)],
        11.2, [EXPIRED], False, 11.0),
    "release-waits-for-a-probe": ([at(0, marker(S)), at(1, marker(RL))], 1, [], True, MINUS_INF),
    "release-after-a-probe": (
        [at(0, marker(S)), at(1, marker(RL)), probe_at(1), read_at(1)],
        1, [(0, "released")], False, 1.0),
    "nack-after-a-probe": (
        [at(0, marker(S)), at(1, marker(N, after_ms=500, reason="x")), probe_at(1.5),
         read_at(1.6)],
        1.6, [(1, "x")], False, 1.5),
    "reject-after-a-probe": (
        [at(0, marker(S)), at(1, marker(RJ)), probe_at(1.5), read_at(1.6)],
        1.6, [(1, "rejected")], False, 1.5),
    "end-read-before-the-probe-wins": (
        [at(0, marker(S)), probe_at(10), at(10.1, marker(E)), read_at(10.2)],
        10.2, [], False, 10.0),
    "keepalive-read-before-the-probe-wins": (
        [at(0, marker(S)), probe_at(10), at(10.1, marker(K)), read_at(10.2)],
        10.2, [], False, 10.0),
}  # fmt: skip


@pytest.mark.parametrize(
    ("script", "when", "expected", "needed", "horizon"),
    PROBE_SCENARIOS.values(),
    ids=PROBE_SCENARIOS.keys(),
)
def test_probe_scenarios(
    script: list[Step],
    when: float,
    expected: list[tuple[int, str]],
    needed: bool,
    horizon: float,
) -> None:
    state = probing()
    run(state, script)
    assert steps(state.due(when)) == expected
    assert state.probe_needed(when) is needed
    assert state.horizon == horizon
    probes = [s for s in script if s.kind == "probe"]
    reads = [s for s in script if s.kind == "read"]
    assert (state.stats["probe_sent"], state.stats["probe_read"]) == (len(probes), len(reads))


def test_a_probe_batched_with_markers() -> None:
    state = probing()
    probe = state.probe(3)
    feed(state, encode_entries([probe, (int(S), 0, 1, 40, 1, LEASE_MS, 0, 0)], []), 3.5)
    assert state.stats["batch"] == 1 and state.stats["probe_read"] == 1
    assert state.horizon == 3.0 and state.deliveries() == [DELIVERY]
    assert state.due(3.5 + LEASE_S) == [] and state.probe_needed(3.5 + LEASE_S)
    feed(state, encode_entries([state.probe(3.5 + LEASE_S)], []), 3.5 + LEASE_S)
    assert steps(state.due(3.5 + LEASE_S)) == [EXPIRED]


def test_probe_entry_and_reading_it_back() -> None:
    state = probing()
    entry = state.probe(12.3456)
    assert entry == (int(P), 0, PARTITION, 12345, NONCE, 0, 0, 0)
    assert check_entry(entry) is None
    assert state.stats["probe_sent"] == 1
    value = encode_entries([entry], [])
    feed(state, value, 12.4)
    assert state.horizon == 12.345
    assert state.stats["probe_read"] == 1 and state.stats["foreign_probe"] == 0
    assert state.in_flight == 0 and state.stats["bad_marker"] == 0
    assert state.stats["unknown_delivery"] == 0, "a probe names no record"


def test_a_foreign_probe_changes_nothing() -> None:
    state = probing()
    feed(state, marker(S), 0)
    state.probe(10)
    feed(state, probe_record(10_000, OTHER_NONCE), 10.5)
    assert state.stats["foreign_probe"] == 1 and state.stats["probe_read"] == 0
    assert state.horizon == MINUS_INF
    assert state.due(10.5) == [] and not state.probe_needed(10.5), "still outstanding"
    assert state.in_flight == 1 and state.next_deadline() == LEASE_S


def test_an_older_own_probe_never_lowers_the_horizon() -> None:
    state = probing()
    feed(state, probe_record(11_000), 11)
    feed(state, probe_record(10_000), 11)
    assert state.horizon == 11.0 and state.stats["probe_read"] == 2


def test_reading_an_older_probe_leaves_the_newer_outstanding() -> None:
    state = probing()
    feed(state, marker(S), 0)
    feed(state, marker(S, LATER, after_ms=10_500), 0)
    state.probe(10)
    feed(state, marker(E), 10.1)  # the first deadline is now 10.5, after that probe
    assert state.probe_needed(10.6)
    state.probe(10.6)
    feed(state, probe_record(10_000), 10.7)  # the first probe comes back
    assert state.horizon == 10.0 and state.due(10.7) == []
    assert not state.probe_needed(10.7), "the second is still on its way"
    feed(state, probe_record(10_600), 10.8)
    assert [d.delivery for d in state.due(10.8)] == [LATER]


def test_claimed_again_only_a_probe_sent_since_opens_the_gate() -> None:
    """A partition kept through a rebalance and claimed again: another replica may have
    redelivered from it in between, after this replica's last probe. Only a probe written
    after the claim (under the new nonce) proves those redeliveries have been read."""
    state = probing()
    feed(state, marker(S), 0)
    state.probe(LEASE_S)
    feed(state, probe_record(int(LEASE_S * 1000)), LEASE_S + 0.1)
    assert state.horizon == LEASE_S
    state.regate(OTHER_NONCE)
    assert state.horizon == MINUS_INF and state.due(LEASE_S + 0.2) == []
    feed(state, probe_record(int(LEASE_S * 1000) + 150), LEASE_S + 0.2)  # sent before
    assert state.due(LEASE_S + 0.3) == [] and state.stats["foreign_probe"] == 1
    assert state.probe_needed(LEASE_S + 0.3), "a new probe goes out at once"
    feed(state, encode_entries([state.probe(LEASE_S + 0.3)], []), LEASE_S + 0.4)
    assert steps(state.due(LEASE_S + 0.4)) == [EXPIRED]


def test_no_probes_while_replaying() -> None:
    state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S, probe_nonce=NONCE)
    state.set_position(0)
    state.set_end_offset(2)
    feed(state, marker(S), 0)
    assert state.replaying
    assert not state.probe_needed(100) and state.due(100) == []
    feed(state, marker(K, OTHER_OFFSET), 0)
    assert not state.replaying
    assert state.probe_needed(100)


def test_a_probe_sent_during_the_replay_lets_the_leases_overdue_at_its_end_go_out() -> None:
    """A probe written while the replay runs is read back right behind it: the leases that
    ran out meanwhile go out as it ends, not a probe's round trip later."""

    def replaying() -> PartitionState:
        state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S, probe_nonce=NONCE)
        state.set_position(0)
        state.set_end_offset(2)
        feed(state, marker(S), 0)  # its lease runs out before the replay is over
        return state

    now = LEASE_S + 0.5
    state = replaying()
    assert state.replaying and state.replay_probe_needed(now)
    probe = state.probe(now)
    assert not state.replay_probe_needed(now + PROBE_RETRY_S / 2), "one per PROBE_RETRY_S"
    assert state.replay_probe_needed(now + PROBE_RETRY_S)
    feed(state, marker(K, OTHER_OFFSET), now + 0.1)  # the replay's last record
    assert not state.replaying and not state.replay_probe_needed(now + PROBE_RETRY_S)
    feed(state, encode_entries([probe], []), now + 0.2)
    assert steps(state.due(now + 0.2)) == [EXPIRED]

    without = replaying()
    feed(without, marker(K, OTHER_OFFSET), now + 0.1)
    assert without.due(now + 0.2) == [] and without.probe_needed(now + 0.2), "a round trip more"


def test_claimed_again_during_the_replay_a_replay_probe_goes_out_at_once() -> None:
    state = PartitionState(PARTITION, probe_nonce=NONCE)
    state.set_position(0)
    state.set_end_offset(5)
    state.probe(1.0)
    assert not state.replay_probe_needed(1.5)
    state.regate(OTHER_NONCE)
    assert state.replay_probe_needed(1.5), "the one sent under the old nonce no longer counts"
    assert state.probe(1.5)[4] == OTHER_NONCE


def test_no_replay_probes_without_a_nonce_or_once_caught_up() -> None:
    assert not caught_up().replay_probe_needed(100)
    assert not probing().replay_probe_needed(100)
    state = PartitionState(PARTITION)
    state.set_position(0)
    state.set_end_offset(5)
    assert state.replaying and not state.replay_probe_needed(100)


def test_an_own_probe_in_the_backlog_still_moves_the_horizon() -> None:
    state = PartitionState(PARTITION, probe_nonce=NONCE)
    state.set_position(0)
    state.set_end_offset(5)
    feed(state, probe_record(7_000), 0)
    assert state.replaying and state.horizon == 7.0


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e9, allow_nan=False))
@example(0.0005 + 0.999 + 0.999 + 0.0005)  # 1.9989999999999999, whose * 1000 is 1999.0
def test_a_probe_never_claims_more_than_its_send_time(now: float) -> None:
    state = probing()
    entry = state.probe(now)
    assert entry[3] / 1000 <= now < (entry[3] + 1) / 1000 + 1e-6
    feed(state, encode_entries([entry], []), now)
    assert state.horizon <= now
    assert not state.probe_needed(now)


def test_without_a_nonce_the_clock_decides() -> None:
    state = caught_up()
    assert state.probe_nonce is None and state.horizon == float("inf")
    feed(state, marker(S), 0)
    assert not state.probe_needed(LEASE_S), "no probes"
    with pytest.raises(ValueError, match="no probes"):
        state.probe(LEASE_S)
    for nonce in (0, NONCE):
        feed(state, probe_record(5_000, nonce), 1)
    assert state.stats["foreign_probe"] == 2 and state.stats["probe_read"] == 0
    assert state.horizon == float("inf")
    assert steps(state.due(LEASE_S)) == [EXPIRED]


class ProbingStateMachine(PartitionStateMachine):
    """The same markers as :class:`PartitionStateMachine`, read by a state that writes
    probes, plus probes written, read back (in the order written), lost, and other
    trackers' probes. Invariant: nothing is ever due before a probe sent at or after its
    deadline has been read back."""

    def __init__(self) -> None:
        super().__init__()
        self.state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S, probe_nonce=NONCE)
        self.outbox: list[tuple[float, bytes]] = []
        self.read_horizon = MINUS_INF
        """The send time (whole ms) of the newest own probe read back."""
        self.outstanding: float | None = None
        """When the probe not read back yet was sent."""
        self.sent = self.read = 0

    def _waiting(self) -> dict[Delivery, float]:
        return {d: t.not_before for d, t in self.model.tracked.items() if not t.redelivering}

    @rule()
    def send_probe(self) -> None:
        entry = self.state.probe(self.now)
        assert entry[4] == NONCE and entry[3] == floor_ms(self.now)
        self.outbox.append((self.now, encode_entries([entry], [])))
        self.outstanding = self.now
        self.sent += 1

    @precondition(lambda self: self.outbox)
    @rule()
    def read_probe(self) -> None:
        sent, value = self.outbox.pop(0)
        self._feed(value)
        self.read += 1
        sent_ms = floor_ms(sent)
        self.read_horizon = max(self.read_horizon, sent_ms / 1000)
        if self.outstanding is not None and sent_ms >= floor_ms(self.outstanding):
            self.outstanding = None

    @precondition(lambda self: self.outbox)
    @rule()
    def lose_probe(self) -> None:
        self.outbox.pop(0)

    # Short leases and small steps, so deadlines pass between probes more often.
    @rule(
        kind=st.sampled_from([S, K, E, RL]),
        d=st.sampled_from(DELIVERIES),
        after_ms=st.sampled_from([1, 500, 1500]),
    )
    def short(self, kind: MarkerType, d: Delivery, after_ms: int) -> None:
        self.one_marker(make(kind, d, after_ms=after_ms))

    @rule(dt=st.sampled_from([0.0005, 0.001, 0.3, 0.999, PROBE_RETRY_S]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(sent_ms=st.integers(0, 2**63 - 1), nonce=st.integers(0, 2**32 - 1))
    def foreign_probe(self, sent_ms: int, nonce: int) -> None:
        if nonce == NONCE:
            return
        before = self.state.stats["foreign_probe"]
        self._feed(probe_record(sent_ms, nonce))
        assert self.state.stats["foreign_probe"] == before + 1

    @rule(limit=st.integers(1, 4))
    def poll(self, limit: int) -> None:
        waiting = self._waiting()
        dues = self._poll(limit)
        for due in dues:
            assert waiting[due.delivery] <= self.read_horizon, (
                f"{due.delivery} due at {self.now} before a probe sent after its deadline "
                f"{waiting[due.delivery]} was read back (horizon {self.read_horizon})"
            )
        if len(dues) < limit and not self.state.replaying:
            cutoff = min(self.now, self.read_horizon)
            ready = {d for d, not_before in waiting.items() if not_before <= cutoff}
            assert ready <= {due.delivery for due in dues}, "everything ready is due"

    @invariant()
    def horizon_is_the_newest_own_probe_read(self) -> None:
        assert self.state.horizon == self.read_horizon
        assert self.state.horizon <= self.now
        assert (self.state.stats["probe_sent"], self.state.stats["probe_read"]) == (
            self.sent,
            self.read,
        )

    @invariant()
    def probe_asked_for_exactly_when_needed(self) -> None:
        waiting = self._waiting()
        expected = False
        if waiting and not self.state.replaying:
            first = min(waiting.values())
            sent = self.outstanding
            expected = (
                self.read_horizon < first <= self.now
                and (sent is None or self.now - sent >= PROBE_RETRY_S or sent < first)
            )  # fmt: skip
        assert self.state.probe_needed(self.now) is expected


TestProbingStateMachine = ProbingStateMachine.TestCase
TestProbingStateMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


# -- watched copies (PartitionState.redelivered with copy=) -------------------------------------

COPY: Delivery = (RETRY_LANE, 5, 900)
COPY_KEY = delivery_key(*COPY)
UNREAD_S = 2.0


def redelivered_with_watch(**start: object) -> tuple[PartitionState, int]:
    """A delivery whose lease ran out at LEASE_S and whose copy (COPY) was written then and
    is watched; returns the state and the original START's offset."""
    state = caught_up(position=7)
    start_offset = feed(state, marker(S, **start), 0)  # type: ignore[arg-type]
    [due] = state.due(LEASE_S)
    state.redelivered(due.key, copy=COPY_KEY, queue="orders", now=LEASE_S, unread_s=UNREAD_S)
    return state, start_offset


def test_a_copy_nobody_takes_comes_due_with_its_queue_after_unread_s() -> None:
    state, _ = redelivered_with_watch(max_attempts=5, dlq="orders.bad")
    assert (state.in_flight, state.watched) == (0, 1), "a watch is held by nobody"
    assert state.deliveries() == []
    assert state.commit_offset() == state.position, "a watch holds back no commit"
    assert state.due(LEASE_S + UNREAD_S - 0.001) == []
    [due] = state.due(LEASE_S + UNREAD_S)
    assert (due.key, due.unread_queue, due.attempt_step) == (COPY_KEY, "orders", 0)
    assert (due.max_attempts, due.dead_letter_queue) == (5, "orders.bad"), "from the START"
    assert due.start_offset < 0
    state.redelivered(due.key)  # copied again (no new watch asked for)
    assert (state.watched, state.stats["redeliveries:unread"]) == (0, 1)


def test_a_watched_copy_taken_becomes_a_lease_like_any_other() -> None:
    state, _ = redelivered_with_watch()
    taken = feed(state, marker(S, COPY, attempt=ATTEMPT + 1), LEASE_S + 1)
    assert (state.in_flight, state.watched, state.stats["unread_taken"]) == (1, 0, 1)
    assert state.stats["duplicate_start"] == 0
    assert state.commit_offset() == taken, "its START now holds back the commit"
    assert state.due(LEASE_S + 1 + LEASE_S - 0.001) == [], "never before its own lease"
    [due] = state.due(LEASE_S + 1 + LEASE_S)
    assert (due.key, due.unread_queue, due.attempt_step) == (COPY_KEY, "", 1)
    assert (due.start_offset, due.reason) == (taken, "lease expired")


def test_a_watched_copy_acked_is_forgotten() -> None:
    state, _ = redelivered_with_watch()
    feed(state, marker(S, COPY), LEASE_S + 0.5)
    feed(state, marker(E, COPY), LEASE_S + 0.6)
    assert (state.in_flight, state.watched, state.next_deadline()) == (0, 0, None)


def test_a_watch_is_looked_at_a_few_times_then_dropped() -> None:
    from tracker.state import UNREAD_CHECKS

    state, _ = redelivered_with_watch()
    now = LEASE_S + UNREAD_S
    looked_at = [UNREAD_S]  # after the copy was written
    for check in range(1, UNREAD_CHECKS):
        [due] = state.due(now)
        state.keep_watching(due.key, now, UNREAD_S)
        assert state.due(now + UNREAD_S - 0.001) == [] and state.watched == 1
        assert state.stats["unread_waits"] == check
        now += UNREAD_S
        looked_at.append(now - LEASE_S)
    assert looked_at == [2.0 * n for n in range(1, 16)][:UNREAD_CHECKS]
    [due] = state.due(now)
    state.keep_watching(due.key, now, UNREAD_S)
    assert (state.watched, state.next_deadline(), state.stats["unread_unwatched"]) == (0, None, 1)
    state.keep_watching(due.key, now, UNREAD_S)  # a late second report is harmless


def test_a_watched_copy_taken_while_being_copied_again_stays_a_watch() -> None:
    state, _ = redelivered_with_watch()
    [due] = state.due(LEASE_S + UNREAD_S)
    feed(state, marker(S, COPY), LEASE_S + UNREAD_S + 0.1)
    assert state.watched == 1 and state.stats["duplicate_start"] == 1
    # The second copy fails: it is a watch again, due after the retry interval, not a lease.
    state.redelivery_failed(due.key, LEASE_S + UNREAD_S + 0.2, retry_after_s=1.0)
    [again] = state.due(LEASE_S + UNREAD_S + 1.2)
    assert again.unread_queue == "orders"


@pytest.mark.parametrize(
    ("dead_lettered", "unread_s", "copy"),
    [(True, UNREAD_S, COPY_KEY), (False, 0.0, COPY_KEY), (False, UNREAD_S, None)],
    ids=["dead-letter", "watching-off", "where-unknown"],
)
def test_no_watch_for_dead_letters_or_when_off(
    dead_lettered: bool, unread_s: float, copy: int | None
) -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [due] = state.due(LEASE_S)
    state.redelivered(
        due.key, dead_lettered=dead_lettered, copy=copy, queue="q", now=LEASE_S, unread_s=unread_s
    )
    assert (state.watched, state.next_deadline()) == (0, None)


@settings(max_examples=200, deadline=None)
@given(
    taken_after=st.one_of(st.none(), st.floats(0.0, 10.0)),
    lease_ms=st.integers(1, 60_000),
    asked=st.lists(st.floats(0.0, 80.0), min_size=1, max_size=6),
)
def test_watched_copies_never_come_due_early(
    taken_after: float | None, lease_ms: int, asked: list[float]
) -> None:
    """Untaken, a watch is not due before ``unread_s``; taken, not before its own lease
    from when its START was read; and it never holds back the offset commit untaken."""
    state, _ = redelivered_with_watch()
    taken_at = None if taken_after is None else LEASE_S + taken_after
    fed = False
    for t in sorted(LEASE_S + a for a in asked):
        if taken_at is not None and not fed and t >= taken_at:
            feed(state, marker(S, COPY, after_ms=lease_ms), taken_at)
            fed = True
        if not fed:
            assert state.commit_offset() == state.position
        for d in state.due(t):
            if d.unread_queue:
                assert t >= LEASE_S + UNREAD_S
            else:
                assert taken_at is not None and t >= taken_at + lease_ms / 1000
            state.redelivered(d.key)


# -- STARTs held aside for their END (young_s): nothing observable may change -----------------

HELD_KEYS = [(0, 0, 1), (0, 0, 2), (1, 3, 7)]
held_markers = st.builds(
    lambda kind, delivery, after_ms, attempt: make(
        kind, delivery, after_ms=after_ms, attempt=attempt, reason="r"
    ),
    st.sampled_from([S, S, S, K, E, E, N, RL, RD, DL, RJ]),
    st.sampled_from(HELD_KEYS),
    st.sampled_from([0, 200, 400, 900, 1_000, 5_000, LEASE_MS, MAX_LEASE_MS + 1]),
    st.sampled_from([0, 1, 2]),
)


def observed(state: PartitionState, now: float) -> tuple[object, ...]:
    keys = [delivery_key(*d) for d in HELD_KEYS]
    return (
        state.commit_offset(),
        state.in_flight,
        sorted(state.deliveries()),
        [state.deadline_of(k) for k in keys],
        state.next_deadline(),
        state.next_deadline(after=now),
        state.tick_needed(now, 1.0),
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(held_markers, min_size=1, max_size=3),
            st.sampled_from([0.0, 0.0, 0.05, 0.3, 0.6, 2.0, 12.0]),
            st.sampled_from(["none", "redelivered", "failed", "copy"]),
        ),
        max_size=40,
    ),
    st.sampled_from([0.5, 0.25]),
    st.sampled_from([MAX_HELD, 2, 3]),
)
def test_holding_starts_aside_changes_nothing_observable(
    records: list[tuple[list[Marker], float, str]], young_s: float, max_held: int
) -> None:
    """A state holding STARTs aside for their END and one giving each a lease at once
    (``young_s=0``) read the same markers at the same times: every answer is the same,
    also when the held table fills (``MAX_HELD`` made small)."""
    with mock.patch.object(state_module, "MAX_HELD", max_held):
        compare_holding(records, young_s)


def compare_holding(records: list[tuple[list[Marker], float, str]], young_s: float) -> None:
    held, plain = probing(young_s=young_s), probing(young_s=0.0)
    now = 0.0
    for batch, dt, outcome in records:
        now += dt
        value = encode_batch(batch)
        for state in (held, plain):
            feed(state, value, now)
        assert observed(held, now) == observed(plain, now)
        assert held.probe_needed(now) == plain.probe_needed(now)
        if held.probe_needed(now):
            for state in (held, plain):
                feed(state, probe_record(floor_ms(now)), now)
        dues = held.due(now), plain.due(now)
        assert sorted(dues[0], key=lambda d: d.key) == sorted(dues[1], key=lambda d: d.key)
        for state, due in zip((held, plain), dues, strict=True):
            for d in due:
                if outcome == "failed":
                    state.redelivery_failed(d.key, now, RETRY_S)
                else:
                    copy = delivery_key(*HELD_KEYS[0]) if outcome == "copy" else None
                    state.redelivered(d.key, copy=copy, queue="q", now=now, unread_s=2.0)
        assert observed(held, now) == observed(plain, now)
        assert held.stats == plain.stats


def holding() -> PartitionState:
    """A caught-up state past its take-over window (nothing is held during one)."""
    state = caught_up()
    feed(state, probe_record(0, OTHER_NONCE), 0.5)
    return state


def test_an_end_read_soon_after_its_start_never_makes_a_lease() -> None:
    state = holding()
    start = feed(state, marker(S), 1.0)
    assert state._deadlines == []  # held: no lease yet
    assert state.in_flight == 1 and state.deadline_of(KEY) == 1.0 + LEASE_S
    assert state.commit_offset() == start
    feed(state, marker(E), 1.1)
    assert state.in_flight == 0 and state._deadlines == [] and state.stats["end"] == 1
    assert state.commit_offset() == state.position


def test_a_burst_of_starts_holds_at_most_max_held_and_leases_the_oldest_first() -> None:
    """A tracker catching up reads STARTs faster than ``young_s`` lets them go: it holds
    at most MAX_HELD, giving the older half their leases (from when each was read) each
    time the table fills, so the memory a burst takes is about that of its leases."""
    state = holding()
    count = 2 * MAX_HELD + 10
    reads = [1.0 + i * 1e-6 for i in range(count)]
    first = state.position
    for i, at in enumerate(reads):
        feed(state, marker(S, (0, 0, i)), at)
        assert len(state._young_order) <= MAX_HELD
    leased = sorted(d.key for d in state._deadlines)
    assert leased == [delivery_key(0, 0, i) for i in range(len(leased))]  # the oldest
    assert len(leased) == count - len(state._young) > 0
    assert state.in_flight == count
    assert state.deadline_of(delivery_key(0, 0, 0)) == reads[0] + LEASE_S
    assert state.deadline_of(delivery_key(0, 0, count - 1)) == reads[-1] + LEASE_S
    assert state.commit_offset() == first
    feed(state, marker(E, (0, 0, count - 1)), 1.1)  # still held: an END drops it at once
    assert state.in_flight == count - 1


def test_a_held_start_gets_its_lease_from_when_it_was_read() -> None:
    state = holding()
    feed(state, marker(S), 1.0)
    feed(state, marker(S, (0, 0, 99)), 1.0 + state.young_s)  # its age lets the first go
    assert [d.key for d in state._deadlines] == [KEY]  # the second is held
    assert state.due(1.0 + LEASE_S - 0.001) == []
    assert [d.delivery for d in state.due(1.0 + LEASE_S)] == [DELIVERY]


def test_a_keepalive_read_while_its_start_is_held_moves_its_deadline() -> None:
    state = holding()
    feed(state, marker(S), 1.0)
    feed(state, marker(K, after_ms=2 * LEASE_MS), 1.25)
    assert state._deadlines == []  # still held: moved in place
    assert state.deadline_of(KEY) == 1.25 + 2 * LEASE_S
    feed(state, marker(S, (0, 0, 99)), 2.0)  # the first START's age gives it its lease
    assert [d.key for d in state._deadlines] == [KEY]
    assert state.deadline_of(KEY) == 1.25 + 2 * LEASE_S
    assert [d.delivery for d in state.due(1.0 + LEASE_S)] == []
    due = state.due(1.25 + 2 * LEASE_S)
    assert [d.delivery for d in due] == [(0, 0, 99), DELIVERY]


def test_the_loop_wakes_when_the_oldest_held_start_gets_its_lease() -> None:
    state = holding()
    feed(state, marker(S), 1.0)
    assert state.next_wake(1.0) == 1.0 + state.young_s
    assert state.next_deadline(after=1.0) == 1.0 + LEASE_S
    assert state.next_wake(1.0 + state.young_s) == 1.0 + LEASE_S
    assert [d.key for d in state._deadlines] == [KEY]
