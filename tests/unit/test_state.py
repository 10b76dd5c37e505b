"""PartitionState, the tracker's pure core: scenario tables plus hypothesis properties."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.markers import MAX_ATTEMPT, Marker, MarkerType, decode, encode
from tracker.state import PartitionState, Redeliver, complete

PARTITION = 2
DEFAULT_LEASE_S = 30.0
LEASE_MS = 10_000
LEASE_S = LEASE_MS / 1000
ATTEMPT = 3
DELIVERY = (1, 40)
KEY, VALUE, HEADERS = b"key", b"payload", (("h", b"1"), ("i", b""))
MAX_LEASE_MS = int(MAX_REDELIVERY_TIMEOUT_S * 1000)

S, K, E, N, RD, RL = (
    MarkerType.START,
    MarkerType.KEEPALIVE,
    MarkerType.END,
    MarkerType.NACK,
    MarkerType.REDELIVERED,
    MarkerType.RELEASE,
)


def marker(
    kind: MarkerType,
    delivery: tuple[int, int] = DELIVERY,
    *,
    after_ms: int = LEASE_MS,
    attempt: int = ATTEMPT,
    reason: str = "",
) -> bytes:
    start = kind is MarkerType.START
    return encode(
        Marker(
            type=kind,
            queue="q",
            partition=delivery[0],
            offset=delivery[1],
            message_id=f"id-{delivery[0]}-{delivery[1]}",
            attempt=attempt,
            redeliver_after_ms=after_ms,
            key=KEY if start else b"",
            value=VALUE if start else b"",
            headers=HEADERS if start else (),
            reason=reason,
        )
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


def attempts(actions: list[Redeliver]) -> list[tuple[int, str]]:
    return [(a.attempt, a.reason) for a in actions]


# -- scenario table ---------------------------------------------------------------------------
# Each row: markers as (read time, bytes), the time due() is asked, and the expected
# (attempt, reason) of every redelivery.

EXPIRED = (ATTEMPT + 1, "lease expired")

SCENARIOS = {
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
        [(ATTEMPT + 1, "boom")],
    ),
    "nack-default-reason": (
        [(0, marker(S)), (1, marker(N, after_ms=0))],
        1,
        [(ATTEMPT + 1, "nacked")],
    ),
    "nack-negative-delay-is-now": (
        [(0, marker(S)), (1, marker(N, after_ms=-5))],
        1,
        [(ATTEMPT + 1, "nacked")],
    ),
    "nack-huge-delay-capped": (
        [(0, marker(S)), (1, marker(N, after_ms=MAX_LEASE_MS + 1))],
        1 + MAX_REDELIVERY_TIMEOUT_S,
        [(ATTEMPT + 1, "nacked")],
    ),
    "release-same-attempt": ([(0, marker(S)), (1, marker(RL))], 1, [(ATTEMPT, "released")]),
    "release-own-reason": (
        [(0, marker(S)), (1, marker(RL, reason="closing"))],
        1,
        [(ATTEMPT, "closing")],
    ),
    "redelivered-marker-drops": ([(0, marker(S)), (1, marker(RD))], 10 * LEASE_S, []),
    "end-of-other-delivery": (
        [(0, marker(S)), (1, marker(E, (DELIVERY[0], DELIVERY[1] + 1)))],
        LEASE_S,
        [EXPIRED],
    ),
    "duplicate-start-later-lease": ([(0, marker(S)), (4, marker(S))], LEASE_S, []),
    "duplicate-start-one-redelivery": (
        [(0, marker(S)), (4, marker(S))],
        4 + LEASE_S,
        [EXPIRED],
    ),
    "attempt-zero-treated-as-one": ([(0, marker(S, attempt=0))], LEASE_S, [(2, "lease expired")]),
    "attempt-capped-at-uint32": (
        [(0, marker(S, attempt=MAX_ATTEMPT))],
        LEASE_S,
        [(MAX_ATTEMPT, "lease expired")],
    ),
    "zero-lease-uses-default": ([(0, marker(S, after_ms=0))], LEASE_S, []),
    "zero-lease-default-expires": ([(0, marker(S, after_ms=0))], DEFAULT_LEASE_S, [EXPIRED]),
    "garbage-ignored": ([(0, marker(S)), (1, b"\xff\x00"), (2, None)], LEASE_S, [EXPIRED]),
}


@pytest.mark.parametrize(("records", "at", "expected"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenarios(
    records: list[tuple[float, bytes]], at: float, expected: list[tuple[int, str]]
) -> None:
    state = caught_up()
    for now, value in records:
        feed(state, value, now)
    assert attempts(state.due(at)) == expected


def test_redeliver_carries_the_start_payload() -> None:
    state = caught_up()
    start = feed(state, marker(S), 0)
    [action] = state.due(LEASE_S)
    assert action == Redeliver(
        marker_partition=PARTITION,
        delivery=DELIVERY,
        queue="q",
        message_id=f"id-{DELIVERY[0]}-{DELIVERY[1]}",
        attempt=ATTEMPT + 1,
        key=KEY,
        value=VALUE,
        headers=HEADERS,
        reason="lease expired",
        start_offset=start,
    )
    assert state.due(100 * LEASE_S) == [], "an action is handed out once"


def test_without_payloads_the_action_points_at_the_start_marker() -> None:
    state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S, keep_payloads=False)
    state.set_position(0)
    state.set_end_offset(0)
    start = feed(state, marker(S), 0)
    [action] = state.due(LEASE_S)
    assert not action.complete
    assert (action.key, action.value, action.headers) == (b"", b"", ())
    assert (action.start_offset, action.delivery, action.attempt_step) == (start, DELIVERY, 1)
    full = caught_up()
    feed(full, marker(S), 0)
    [expected] = full.due(LEASE_S)
    assert expected.complete
    assert complete(action, decode(marker(S))) == expected


def test_discard_forgets_a_delivery_and_counts_why() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [action] = state.due(LEASE_S)
    state.discard(action.delivery, "start_missing")
    assert state.in_flight == 0 and state.stats["start_missing"] == 1
    assert state.stats["redeliveries"] == 0


def test_redelivered_drops_the_entry_and_advances_commit() -> None:
    state = caught_up(position=7)
    start = feed(state, marker(S), 0)
    assert state.commit_offset() == start
    [action] = state.due(LEASE_S)
    assert state.commit_offset() == start, "still in flight while being redelivered"
    state.redelivered(action.delivery)
    assert state.in_flight == 0
    assert state.next_deadline() is None
    assert state.commit_offset() == state.position == start + 1
    state.redelivered(action.delivery)  # a second report is harmless
    assert state.in_flight == 0


def test_redelivery_failed_reschedules() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [first] = state.due(LEASE_S)
    state.redelivery_failed(first.delivery, now=LEASE_S, retry_after_s=2)
    assert state.next_deadline() == LEASE_S + 2
    assert state.due(LEASE_S + 1.999) == []
    assert state.due(LEASE_S + 2) == [first]
    assert state.stats["redelivery_failed"] == 1


def test_redelivery_failed_is_ignored_unless_redelivering() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    state.redelivery_failed(DELIVERY, now=0, retry_after_s=1)
    assert state.next_deadline() == LEASE_S
    assert state.stats["redelivery_failed"] == 0


def test_markers_while_redelivering_are_late() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [action] = state.due(LEASE_S)
    for kind in (K, N, RL):
        feed(state, marker(kind), LEASE_S)
    assert state.stats["late_marker"] == 3
    assert state.next_deadline() is None, "nothing rescheduled behind the redelivery's back"
    state.redelivered(action.delivery)
    assert state.in_flight == 0


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
    feed(state, marker(K, (0, 1)), 1)
    assert state.replaying and state.due(100 * LEASE_S) == [], "position < end offset"
    feed(state, marker(E, (0, 1)), 2)
    assert not state.replaying
    assert [a.delivery for a in state.due(100 * LEASE_S)] == [DELIVERY]


def test_set_position_only_once() -> None:
    state = caught_up(position=5)
    state.set_position(9)
    assert state.position == 5
    assert state.commit_offset() == 5


def test_commit_offset_is_oldest_in_flight_start() -> None:
    state = caught_up(position=100)
    a = feed(state, marker(S, (0, 1)), 0)
    b = feed(state, marker(S, (0, 2)), 0)
    feed(state, marker(S, (0, 3)), 0)
    assert state.commit_offset() == a
    feed(state, marker(E, (0, 2)), 1)
    assert state.commit_offset() == a
    feed(state, marker(E, (0, 1)), 1)
    assert state.commit_offset() == b + 1
    feed(state, marker(E, (0, 3)), 1)
    assert state.commit_offset() == state.position
    assert state.in_flight == 0


def test_commit_offset_unknown_before_any_position() -> None:
    assert PartitionState(PARTITION).commit_offset() is None


def test_duplicate_start_keeps_one_entry_and_earliest_offset() -> None:
    state = caught_up()
    first = feed(state, marker(S), 0)
    feed(state, marker(S, attempt=ATTEMPT + 5), 1)
    assert state.in_flight == 1
    assert state.deliveries() == [DELIVERY]
    assert state.commit_offset() == first
    assert state.stats["duplicate_start"] == 1
    feed(state, marker(E), 2)
    assert state.in_flight == 0


def test_duplicate_start_after_redelivery_creates_fresh_entry() -> None:
    state = caught_up()
    feed(state, marker(S), 0)
    [action] = state.due(LEASE_S)
    state.redelivered(action.delivery)
    again = feed(state, marker(S), LEASE_S + 1)
    assert state.in_flight == 1
    assert state.commit_offset() == again
    assert attempts(state.due(2 * LEASE_S + 1)) == [EXPIRED]


@pytest.mark.parametrize("kind", [K, E, N, RL, RD])
def test_marker_for_unknown_delivery_is_counted_and_ignored(kind: MarkerType) -> None:
    state = caught_up()
    feed(state, marker(kind), 0)
    assert state.stats["unknown_delivery"] == 1
    assert state.in_flight == 0
    assert state.commit_offset() == state.position == 1


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"\xff\xfe\xfd",
        b"not a marker at all",
        bytes.fromhex("0802") + marker(S)[2:],  # version 2
        bytes.fromhex("0801") + bytes.fromhex("1063") + marker(S)[4:],  # type 99
    ],
)
def test_bad_marker_is_counted_and_skipped(value: bytes | None) -> None:
    state = caught_up()
    feed(state, value, 0)
    assert state.stats["bad_marker"] == 1
    assert state.in_flight == 0
    assert state.position == 1, "the bad record is consumed"
    assert state.due(100 * LEASE_S) == []


def test_bad_marker_samples_really_are_version_2_and_type_99() -> None:
    import kmq

    with pytest.raises(kmq.MarkerDecodeError, match="version 2"):
        decode(bytes.fromhex("0802") + marker(S)[2:])
    with pytest.raises(kmq.MarkerDecodeError, match="type 99"):
        decode(bytes.fromhex("0801") + bytes.fromhex("1063") + marker(S)[4:])


@pytest.mark.parametrize("after_ms", [0, -1, -(2**63), MAX_LEASE_MS + 1, 2**63 - 1])
@pytest.mark.parametrize("kind", [S, K])
def test_absurd_lease_falls_back_to_default(after_ms: int, kind: MarkerType) -> None:
    state = caught_up()
    feed(state, marker(S, after_ms=after_ms if kind is S else LEASE_MS), 0)
    if kind is K:
        feed(state, marker(K, after_ms=after_ms), 0)
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
        feed(state, marker(S, (0, i), after_ms=lease_ms), 0)
    first = state.due(10, limit=2)
    assert [a.delivery for a in first] == [(0, 1), (0, 2)]
    assert [a.delivery for a in state.due(10)] == [(0, 0)]


# -- hypothesis ------------------------------------------------------------------------------

DELIVERIES = [(0, 100), (0, 101), (1, 100)]
LEASES_MS = st.sampled_from([1, 500, LEASE_MS, 60_000, MAX_LEASE_MS, 0, -7, MAX_LEASE_MS + 1])
RETRY_S = 1.5


def effective_lease_s(after_ms: int) -> float:
    """The documented rule: leases outside (0, 12 h] fall back to the default."""
    return after_ms / 1000 if 0 < after_ms <= MAX_LEASE_MS else DEFAULT_LEASE_S


@dataclass
class Tracked:
    """What the spec says about one in-flight delivery."""

    start_offset: int
    not_before: float
    redelivering: bool = False


@dataclass
class Model:
    tracked: dict[tuple[int, int], Tracked] = field(default_factory=dict)
    ended: set[tuple[int, int]] = field(default_factory=set)


class PartitionStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = PartitionState(PARTITION, default_lease_s=DEFAULT_LEASE_S)
        self.model = Model()
        self.now = 0.0
        self.pending: list[tuple[int, int]] = []

    @initialize(start=st.integers(0, 3), backlog=st.integers(0, 6))
    def assign(self, start: int, backlog: int) -> None:
        self.state.set_position(start)
        self.state.set_end_offset(start + backlog)

    def _feed(self, value: bytes | None) -> int:
        return feed(self.state, value, self.now)

    @rule(d=st.sampled_from(DELIVERIES), after_ms=LEASES_MS, attempt=st.integers(0, 5))
    def start(self, d: tuple[int, int], after_ms: int, attempt: int) -> None:
        offset = self._feed(marker(S, d, after_ms=after_ms, attempt=attempt))
        deadline = self.now + effective_lease_s(after_ms)
        t = self.model.tracked.get(d)
        if t is None:
            self.model.tracked[d] = Tracked(offset, deadline)
            self.model.ended.discard(d)
        elif not t.redelivering:
            t.not_before = max(t.not_before, deadline)

    @rule(d=st.sampled_from(DELIVERIES), after_ms=LEASES_MS)
    def keepalive(self, d: tuple[int, int], after_ms: int) -> None:
        self._feed(marker(K, d, after_ms=after_ms))
        t = self.model.tracked.get(d)
        if t is not None and not t.redelivering:
            t.not_before = self.now + effective_lease_s(after_ms)

    @rule(d=st.sampled_from(DELIVERIES), delay_ms=st.integers(0, MAX_LEASE_MS))
    def nack(self, d: tuple[int, int], delay_ms: int) -> None:
        self._feed(marker(N, d, after_ms=delay_ms))
        t = self.model.tracked.get(d)
        if t is not None and not t.redelivering:
            t.not_before = self.now + delay_ms / 1000

    @rule(d=st.sampled_from(DELIVERIES))
    def release(self, d: tuple[int, int]) -> None:
        self._feed(marker(RL, d))
        t = self.model.tracked.get(d)
        if t is not None and not t.redelivering:
            t.not_before = self.now

    @rule(d=st.sampled_from(DELIVERIES), kind=st.sampled_from([E, RD]))
    def end(self, d: tuple[int, int], kind: MarkerType) -> None:
        self._feed(marker(kind, d))
        t = self.model.tracked.pop(d, None)
        if t is not None and kind is E and not t.redelivering:
            self.model.ended.add(d)

    @rule(data=st.binary(max_size=40))
    def garbage(self, data: bytes) -> None:
        try:
            decode(data)
        except Exception:
            before = self.state.in_flight
            self._feed(data)
            assert self.state.in_flight == before

    @rule()
    def null_record(self) -> None:
        self._feed(None)

    @precondition(lambda self: (self.state.position or 0) > 0)
    @rule(back=st.integers(1, 5), kind=st.sampled_from(list(MarkerType)))
    def reread(self, back: int, kind: MarkerType) -> None:
        position = self.state.position
        assert position is not None
        before = (self.state.in_flight, self.state.commit_offset(), self.state.next_deadline())
        self.state.on_record(max(0, position - back), marker(kind, DELIVERIES[0]), self.now)
        after = (self.state.in_flight, self.state.commit_offset(), self.state.next_deadline())
        assert after == before
        assert self.state.position == position

    @rule(dt=st.one_of(st.floats(0, 5), st.sampled_from([LEASE_S, DEFAULT_LEASE_S])))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(limit=st.integers(1, 4))
    def poll(self, limit: int) -> None:
        actions = self.state.due(self.now, limit)
        assert len(actions) <= limit
        if self.state.replaying:
            assert actions == []
        for action in actions:
            d = action.delivery
            assert d not in self.model.ended, f"{d} was ended, then redelivered"
            t = self.model.tracked[d]
            assert not t.redelivering
            assert self.now >= t.not_before, f"{d} due at {self.now} before {t.not_before}"
            assert action.marker_partition == PARTITION
            assert (action.key, action.value, action.headers) == (KEY, VALUE, HEADERS)
            t.redelivering = True
            self.pending.append(d)

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 10), ok=st.booleans())
    def settle(self, i: int, ok: bool) -> None:
        d = self.pending.pop(i % len(self.pending))
        t = self.model.tracked.get(d)
        if ok:
            self.state.redelivered(d)
            self.model.tracked.pop(d, None)
        else:
            self.state.redelivery_failed(d, self.now, RETRY_S)
            # Only an entry still being redelivered is rescheduled: after END and a fresh
            # START, the failure of the stale redelivery does not touch the new entry.
            if t is not None and t.redelivering:
                t.redelivering = False
                t.not_before = self.now + RETRY_S

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
    st.builds(
        marker,
        st.sampled_from(list(MarkerType)),
        st.sampled_from(DELIVERIES),
        after_ms=st.integers(-(2**63), 2**63 - 1),
        attempt=st.integers(0, MAX_ATTEMPT),
    ),
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
        for action in state.due(now):
            assert 1 <= action.attempt <= MAX_ATTEMPT
            if step % 2:
                state.redelivered(action.delivery)
            else:
                state.redelivery_failed(action.delivery, now, RETRY_S)
        commit = state.commit_offset()
        assert commit is not None and state.position is not None
        assert commit <= state.position
        assert state.in_flight == len(state.deliveries())
