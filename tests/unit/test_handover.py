"""Ticks: a successor runs the leases it replays from their predecessor's ticks (pure core,
no broker, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kmq.markers import MarkerType, encode_entries, parse
from kmq.records import delivery_key
from tests.unit.test_state import LEASE_MS, LEASE_S, PARTITION, marker
from tracker import handover
from tracker.handover import DRIFT_MARGIN_S, ceil_ms, parse_tick, tick_text
from tracker.state import PartitionState, floor_ms

S, K, E, N = MarkerType.START, MarkerType.KEEPALIVE, MarkerType.END, MarkerType.NACK
OLD = 7  # the predecessor's nonce
DELIVERY = (0, 1, 40)
KEY = delivery_key(*DELIVERY)


def probe_record(sent_s: float, acked: tuple[int, float] | None = None, nonce: int = OLD) -> bytes:
    """A PROBE of ``nonce`` sent at ``sent_s`` on its clock; with ``acked``, a tick."""
    sent_ms = floor_ms(sent_s)
    text = tick_text(sent_ms, acked)
    return encode_entries([(int(MarkerType.PROBE), 0, PARTITION, sent_ms, nonce, 0, 0,
                            len(text))], [text])  # fmt: skip


def replaying(end: int) -> PartitionState:
    """A successor's state (no probe gate) that replays offsets 0 to ``end``."""
    state = PartitionState(PARTITION)
    state.set_position(0)
    state.set_end_offset(end)
    return state


def replay(state: PartitionState, records: list[bytes], now: float) -> None:
    for offset, value in enumerate(records):
        state.on_record(offset, value, now)


@pytest.mark.parametrize(
    ("sent_ms", "acked", "text", "parsed"),
    [
        (5000, (12, 4.0), b"12 1000", (12, 4000)),
        (5000, (12, 4.9991), b"12 0", (12, 5000)),  # ack time rounded up, never down
        (5000, (12, 5.0004), b"", None),  # acknowledged within its own millisecond
        (5000, (-1, 4.0), b"", None),
        (5000, None, b"", None),
    ],
)
def test_tick_text(
    sent_ms: int, acked: tuple[int, float] | None, text: bytes, parsed: tuple[int, int] | None
) -> None:
    assert tick_text(sent_ms, acked) == text
    assert parse_tick(sent_ms, text) == parsed


@pytest.mark.parametrize("text", [b"12", b"12 x", b"-1 3", b"1 2 3", b"12 6000", b"\xff"])
def test_a_text_that_is_not_a_tick_is_ignored(text: bytes) -> None:
    assert parse_tick(5000, text) is None


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False))
def test_ceil_ms_never_rounds_down(t: float) -> None:
    assert ceil_ms(t) / 1000 >= t and ceil_ms(t) - 1 < t * 1000


def test_a_successor_runs_a_lease_from_the_tick_that_covers_its_start() -> None:
    records = [
        marker(S, DELIVERY),  # 0: written before the probe at 1 was acknowledged
        probe_record(4.0),  # 1
        probe_record(5.0, acked=(1, 5.0)),  # 2: the probe at 1 was on the broker at 5.0
        probe_record(9.0, acked=(2, 8.0)),  # 3: the predecessor lived 3 s longer
    ]
    state = replaying(len(records))
    replay(state, records[:-1], 100.0)  # read long after, in one go, by another clock
    assert state.next_deadline() == 100.0 + LEASE_S, "until the replay is over"
    state.on_record(3, records[-1], 100.0)
    # The clocks' offset is at most 100 - 8 (the last tick); the START was on the broker
    # by 5.0 on the old clock, so by 97.0 on this one: its lease ends by 107.0.
    assert state.next_deadline() == pytest.approx(97.0 + LEASE_S + DRIFT_MARGIN_S)
    assert state.stats["lease_taken_over"] == 1 and state.stats["tick_read"] == 2
    assert state.due(97.0 + LEASE_S) == []
    assert [d.delivery for d in state.due(97.0 + LEASE_S + DRIFT_MARGIN_S + 0.001)] == [DELIVERY]


def test_a_marker_no_tick_covers_keeps_its_lease_from_reading_it() -> None:
    records = [
        marker(S, DELIVERY),  # 0
        probe_record(4.0),  # 1
        probe_record(9.0, acked=(1, 8.0)),  # 2
        marker(K, DELIVERY),  # 3: written after the last acknowledged probe
        probe_record(9.5, acked=(2, 9.2)),  # 4: covers offsets below 2 only
    ]
    state = replaying(len(records))
    replay(state, records, 100.0)
    assert state.next_deadline() == 100.0 + LEASE_S
    assert state.stats["lease_taken_over"] == 0


def test_a_keepalive_covered_by_a_later_tick_runs_from_that_tick() -> None:
    records = [
        marker(S, DELIVERY),  # 0
        probe_record(4.0),  # 1
        probe_record(6.0, acked=(1, 5.0)),  # 2: covers the START
        marker(K, DELIVERY),  # 3
        probe_record(8.0),  # 4
        probe_record(10.0, acked=(4, 9.0)),  # 5: covers the KEEPALIVE
        probe_record(12.5, acked=(5, 12.0)),  # 6: the predecessor lived on
    ]
    state = replaying(len(records))
    replay(state, records, 50.0)
    # Clocks at most 50 - 12 apart; the KEEPALIVE was on the broker by 9.0: by 47.0 here.
    assert state.next_deadline() == pytest.approx(47.0 + LEASE_S + DRIFT_MARGIN_S)


@pytest.mark.parametrize(
    ("late", "deadline"),
    [(marker(N, DELIVERY, after_ms=500), 100.5), (marker(S, DELIVERY), 100.0 + LEASE_S)],
    ids=["nack", "second-start"],
)
def test_a_nack_or_a_second_start_after_a_covered_lease_is_left_alone(
    late: bytes, deadline: float
) -> None:
    records = [
        marker(S, DELIVERY),  # 0
        probe_record(4.0),  # 1
        probe_record(9.0, acked=(1, 5.0)),  # 2
        late,  # 3
        probe_record(11.0),  # 4
        probe_record(12.0, acked=(4, 11.5)),  # 5: covers the late marker too
    ]
    state = replaying(len(records))
    replay(state, records, 100.0)
    assert state.next_deadline() == deadline
    assert state.stats["lease_taken_over"] == 0


def test_ticks_read_after_the_replay_change_nothing() -> None:
    state = replaying(0)
    state.on_record(0, marker(S, DELIVERY), 100.0)
    state.on_record(1, probe_record(4.0), 100.0)
    state.on_record(2, probe_record(9.0, acked=(1, 5.0)), 100.0)
    assert state.due(100.0) == []
    assert state.next_deadline() == 100.0 + LEASE_S
    assert state.stats["tick_read"] == 0


def test_a_settled_delivery_is_not_brought_back() -> None:
    records = [
        marker(S, DELIVERY),
        probe_record(4.0),
        probe_record(9.0, acked=(1, 5.0)),
        marker(E, DELIVERY),
    ]
    state = replaying(len(records))
    replay(state, records, 100.0)
    assert state.due(200.0) == [] and state.in_flight == 0


def test_a_replay_without_ticks_keeps_bounded_bookkeeping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A predecessor that wrote no ticks: the replay's bookkeeping stays bounded (settled
    deliveries leave it, and at most MAX_PENDING leases wait for a tick), and what fell
    out of it keeps the lease from its replay."""
    monkeypatch.setattr(handover, "MAX_PENDING", 3)
    deliveries = [(0, 1, 40 + i) for i in range(6)]
    records = [marker(S, d) for d in deliveries] + [marker(E, deliveries[5])]
    records += [probe_record(4.0), probe_record(9.0, acked=(7, 8.0))]  # covers all six
    state = replaying(len(records) + 1)
    replay(state, records, 100.0)
    book = state._handover
    assert book is not None
    assert len(book._pending) == 0 and len(book._marks) == len(book._bounds) == 2
    state.on_record(len(records), probe_record(10.0, acked=(8, 9.5)), 100.0)
    kept = [state.deadline_of(delivery_key(*d)) for d in deliveries[:5]]
    assert kept[:3] == [100.0 + LEASE_S] * 3, "fell out of the bookkeeping: as without ticks"
    assert kept[3:] == [pytest.approx(8.0 + 90.5 + LEASE_S + DRIFT_MARGIN_S)] * 2


def test_a_replay_keeps_bookkeeping_for_at_most_max_tracked_deliveries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leases covered by ticks stay in the bookkeeping until the replay ends, so their
    number is capped too: one beyond the cap keeps the lease from its replay."""
    monkeypatch.setattr(handover, "MAX_TRACKED", 2)
    deliveries = [(0, 1, 40 + i) for i in range(3)]
    records = [marker(S, deliveries[0]), marker(S, deliveries[1]), probe_record(4.0),
               probe_record(9.0, acked=(2, 8.0)), marker(S, deliveries[2])]  # fmt: skip
    state = replaying(len(records) + 1)
    replay(state, records, 100.0)
    book = state._handover
    assert book is not None
    assert len(book._marks) == len(book._bounds) == 2 and len(book._pending) == 0
    state.on_record(len(records), probe_record(10.0, acked=(5, 9.5)), 100.0)
    taken = [state.deadline_of(delivery_key(*d)) for d in deliveries]
    assert taken[:2] == [pytest.approx(8.0 + 90.5 + LEASE_S + DRIFT_MARGIN_S)] * 2
    assert taken[2] == 100.0 + LEASE_S, "beyond the cap: as without ticks"


def test_a_lease_that_falls_out_of_the_bookkeeping_takes_its_old_bound_along(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handover, "MAX_PENDING", 1)
    other = (0, 1, 41)
    records = [marker(S, DELIVERY), probe_record(4.0), probe_record(9.0, acked=(1, 8.0)),
               marker(K, DELIVERY), marker(S, other)]  # fmt: skip
    state = replaying(len(records) + 1)
    replay(state, records, 100.0)
    book = state._handover
    assert book is not None
    assert set(book._marks) == {delivery_key(*other)} and book._bounds == {}
    state.on_record(len(records), probe_record(10.0, acked=(5, 9.5)), 100.0)
    assert state.deadline_of(KEY) == 100.0 + LEASE_S, "its KEEPALIVE fell out: as without ticks"


def test_tick_needed_and_the_tick_it_writes() -> None:
    state = PartitionState(PARTITION, probe_nonce=OLD)
    state.set_position(0)
    state.set_end_offset(1)
    assert not state.tick_needed(0.0, 1.0), "replaying"
    state.on_record(0, marker(S, DELIVERY), 0.0)
    assert state.tick_needed(0.0, 1.0)
    assert not state.tick_needed(0.0, 0.0), "0: no ticks"
    entry, text = state.tick(0.5, (0, 0.25))
    assert text == b"0 250"
    entries, texts = parse(encode_entries([entry], [text]))
    assert entries == [entry] and texts == [text]
    assert not state.tick_needed(1.4, 1.0) and state.tick_needed(1.5, 1.0)
    state.on_record(1, encode_entries([entry], [text]), 0.6)  # read back like a probe
    assert state.stats["probe_read"] == 1 and state.horizon == 0.5
    assert state.stats["tick_sent"] == 1 and state.stats["probe_sent"] == 0


# -- property: never early, never later than without ticks ------------------------------------


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["S", "K", "E", "N", "probe", "tick"]),
        st.integers(0, 3),  # which delivery; for a tick, which acknowledged probe
        st.floats(0, 3),  # time since the previous record
        st.floats(0, 2),  # for a probe, how long the broker took to acknowledge it
    ),
    max_size=40,
)
OFFSETS = st.floats(-1e5, 1e5)


@settings(max_examples=500, deadline=None)
@given(STEPS, OFFSETS, OFFSETS, st.floats(0, 20))
@example(  # a START between a probe and the tick that passes its acknowledgement on
    [("probe", 0, 0, 0), ("S", 0, 1, 0), ("tick", 0, 0, 0), ("probe", 0, 1, 0), ("tick", 1, 0, 0)],
    0.0, 0.0, 0.0,
)  # fmt: skip
def test_a_lease_taken_over_never_ends_before_its_marker_was_written_plus_the_lease(
    steps: list[tuple[str, int, float, float]], old_clock_s: float, new_clock_s: float,
    read_after_s: float,
) -> None:  # fmt: skip
    """A predecessor's partition with its true append times; the successor reads it all
    ``read_after_s`` after the last record, by a clock ``new_clock_s`` off the real one (the
    predecessor's is ``old_clock_s`` off)."""
    records: list[bytes] = []
    plain: list[bytes] = []  # the same log with every tick a plain probe
    acked: list[tuple[int, float]] = []  # (offset, acknowledged at: real time)
    last: dict[int, float] = {}  # per delivery, when what set its deadline last was appended
    t = 0.0
    for what, which, dt, ack_s in steps:
        t += dt
        if what == "tick":
            known = [(offset, at) for offset, at in acked if at <= t]  # sent after the ack
            if not known:
                continue
            offset, at = known[which % len(known)]
            records.append(probe_record(t + old_clock_s, (offset, at + old_clock_s)))
            plain.append(probe_record(t + old_clock_s))
            continue
        if what == "probe":
            acked.append((len(records), t + ack_s))
            records.append(probe_record(t + old_clock_s))
        else:
            kind = {"S": S, "K": K, "E": E, "N": N}[what]
            records.append(marker(kind, (0, 1, 40 + which), after_ms=LEASE_MS))
            last[which] = t
        plain.append(records[-1])
    now = t + read_after_s + new_clock_s
    with_ticks, without = replaying(len(records)), replaying(len(plain))
    replay(with_ticks, records, now)
    replay(without, plain, now)
    with_ticks.due(float("-inf"))  # the replay is over: takes over what the ticks cover
    without.due(float("-inf"))
    for which, appended in last.items():
        key = delivery_key(0, 1, 40 + which)
        taken, fresh = with_ticks.deadline_of(key), without.deadline_of(key)
        assert (taken is None) == (fresh is None)
        if taken is None or fresh is None:
            continue
        assert taken <= fresh, "a tick only ever brings a deadline forward"
        # (1e-6: the float arithmetic of this test, not of the tracker)
        assert taken - new_clock_s >= appended + LEASE_S - 1e-6, "never before the lease ran out"
