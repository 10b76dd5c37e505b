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
from tracker.handover import (
    DRIFT_MARGIN_S,
    ClockBounds,
    beacon_text,
    ceil_ms,
    parse_beacon,
    parse_tick,
    tick_text,
)
from tracker.state import PartitionState, floor_ms

S, K, E, N = MarkerType.START, MarkerType.KEEPALIVE, MarkerType.END, MarkerType.NACK
OLD = 7  # the predecessor's nonce
NEW = 3  # the successor's clock
DELIVERY = (0, 1, 40)
KEY = delivery_key(*DELIVERY)


def probe_record(sent_s: float, acked: tuple[int, float] | None = None, nonce: int = OLD) -> bytes:
    """A PROBE of ``nonce`` sent at ``sent_s`` on its clock; with ``acked``, a tick."""
    sent_ms = floor_ms(sent_s)
    text = tick_text(sent_ms, acked)
    return encode_entries([(int(MarkerType.PROBE), 0, PARTITION, sent_ms, nonce, 0, 0,
                            len(text))], [text])  # fmt: skip


def replaying(end: int, clocks: ClockBounds | None = None) -> PartitionState:
    """A successor's state (no probe gate) that replays offsets 0 to ``end``."""
    state = PartitionState(PARTITION, clocks=clocks)
    state.set_position(0)
    state.set_end_offset(end)
    return state


def replay(state: PartitionState, records: list[bytes], now: float) -> None:
    for offset, value in enumerate(records):
        state.on_record(offset, value, now)


@pytest.mark.parametrize(
    ("sent_ms", "acked", "clock", "text", "parsed"),
    [
        (5000, (12, 4.0), None, b"12 1000", (12, 4000, None)),
        (5000, (12, 4.0), 77, b"12 1000 77", (12, 4000, 77)),
        (5000, (12, 4.9991), None, b"12 0", (12, 5000, None)),  # ack time rounded up
        (5000, (12, 5.0004), 77, b"", None),  # acknowledged within its own millisecond
        (5000, (-1, 4.0), None, b"", None),
        (5000, None, 77, b"", None),
    ],
)
def test_tick_text(
    sent_ms: int,
    acked: tuple[int, float] | None,
    clock: int | None,
    text: bytes,
    parsed: tuple[int, int, int | None] | None,
) -> None:
    assert tick_text(sent_ms, acked, clock) == text
    assert parse_tick(sent_ms, text) == parsed


@pytest.mark.parametrize(
    "text", [b"12", b"12 x", b"-1 3", b"1 2 x", b"1 2 3 4", b"12 6000", b"\xff", b"clock 5"]
)
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


def test_the_replay_end_says_how_many_open_leases_no_tick_covers() -> None:
    other = (0, 1, 41)
    settled = (0, 1, 42)
    records = [
        marker(S, DELIVERY),  # 0: covered by the tick at 3
        marker(S, settled),  # 1: covered too, but settled below
        probe_record(4.0),  # 2
        probe_record(5.0, acked=(2, 5.0)),  # 3: markers below 2 were on the broker by 5.0
        probe_record(9.0, acked=(3, 8.0)),  # 4: the predecessor lived 3 s longer
        marker(S, other),  # 5: written after the last acknowledged probe
        marker(E, settled),  # 6
    ]
    state = replaying(len(records))
    replay(state, records[:-1], 100.0)
    assert state.replay_leases is None, "not before the replay is over"
    state.on_record(6, records[-1], 100.0)
    assert state.replay_leases == (2, 1)
    assert state.stats["lease_replayed"] == 2 and state.stats["lease_uncovered"] == 1
    assert state.stats["lease_taken_over"] == 1
    assert state.next_deadline() == pytest.approx(97.0 + LEASE_S + DRIFT_MARGIN_S)
    state.replay_leases = None  # the adapter logs it once
    state.on_record(7, marker(S, (0, 1, 43)), 101.0)
    assert state.replay_leases is None and state.stats["lease_replayed"] == 2


def test_an_empty_replay_reports_no_open_leases() -> None:
    state = replaying(0)
    state.on_record(0, marker(S, DELIVERY), 100.0)
    assert state.replay_leases == (0, 0) and state.stats["lease_uncovered"] == 0


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
    deliveries leave it, and at most MAX_TRACKED leases are kept), and a lease beyond it
    keeps the lease from its replay."""
    monkeypatch.setattr(handover, "MAX_TRACKED", 3)
    deliveries = [(0, 1, 40 + i) for i in range(6)]
    records = [marker(S, deliveries[0]), marker(E, deliveries[0])]
    records += [marker(S, d) for d in deliveries[1:]]
    records += [probe_record(4.0), probe_record(9.0, acked=(len(records), 8.0))]  # covers all
    state = replaying(len(records) + 1)
    replay(state, records, 100.0)
    book = state._handover
    assert book is not None
    assert set(book._marks) == {delivery_key(*d) for d in deliveries[1:4]}
    state.on_record(len(records), probe_record(10.0, acked=(len(records) - 1, 9.5)), 100.0)
    kept = [state.deadline_of(delivery_key(*d)) for d in deliveries[1:]]
    assert kept[:3] == [pytest.approx(8.0 + 90.5 + LEASE_S + DRIFT_MARGIN_S)] * 3
    assert kept[3:] == [100.0 + LEASE_S] * 2, "beyond the bookkeeping: as without ticks"


def test_a_replay_keeps_at_most_max_ticks_per_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ticks beyond the cap are as if never written: what only they would cover keeps the
    lease from its replay."""
    monkeypatch.setattr(handover, "MAX_TICKS", 1)
    other = (0, 1, 41)
    records = [marker(S, DELIVERY), probe_record(4.0), probe_record(9.0, acked=(1, 8.0)),
               marker(S, other), probe_record(10.0, acked=(2, 9.5))]  # fmt: skip
    state = replaying(len(records))
    replay(state, records, 100.0)
    assert state.deadline_of(KEY) == pytest.approx(8.0 + 90.5 + LEASE_S + DRIFT_MARGIN_S)
    assert state.deadline_of(delivery_key(*other)) == 100.0 + LEASE_S


def test_a_keepalive_no_tick_covers_drops_the_bound_of_its_start() -> None:
    records = [marker(S, DELIVERY), probe_record(4.0), probe_record(9.0, acked=(1, 8.0)),
               marker(K, DELIVERY)]  # fmt: skip
    state = replaying(len(records))
    replay(state, records, 100.0)
    assert state.deadline_of(KEY) == 100.0 + LEASE_S, "renewed after every tick: afresh"


def test_the_earliest_bound_over_every_writer_wins() -> None:
    """The predecessor (OLD) ticks four times a second, but this replica (NEW) never read
    its beacons live: its ticks, read in the replay 60 s on, only bound its clock loosely.
    This replica's own beacon, written to the partition before it was assigned it, came
    after the same START: on this replica's clock, exactly."""
    clocks = ClockBounds(own=NEW)
    records = [
        marker(S, DELIVERY),  # 0
        probe_record(4.0),  # 1
        probe_record(4.25, acked=(1, 4.1)),  # 2: OLD's tick, the first to cover the START
        beacon_record(40.0, NEW),  # 3: this replica's beacon, on the broker by 40.2 here
        probe_record(4.5, acked=(2, 4.3)),  # 4: then OLD died
        beacon_record(41.0, NEW, acked=(3, 40.2)),  # 5
    ]
    successor = replaying(len(records), clocks)
    replay(successor, records, 100.0)
    # By OLD's ticks: 4.1 + (100 - 4.3) + lease; by its own beacon: 40.2 + lease.
    assert successor.next_deadline() == pytest.approx(40.2 + LEASE_S + DRIFT_MARGIN_S)
    assert [d.delivery for d in successor.due(100.0)] == [DELIVERY]
    without = replaying(len(records))  # no clock of its own to go by
    replay(without, records, 100.0)
    assert without.next_deadline() == pytest.approx(99.8 + LEASE_S + DRIFT_MARGIN_S)


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


def predecessor_log(
    steps: list[tuple[str, int, float, float]], old_clock_s: float, own_clock_s: float = 0.0
) -> tuple[list[bytes], list[bytes], dict[int, float], float]:
    """A predecessor's partition built from ``steps``, by its clock ``old_clock_s`` off the
    real one: the records, the same with every tick a plain probe, per delivery when what
    set its deadline last was appended (real time), and when the last record was. Steps
    ``own`` and ``owntick`` are beacons of the successor (clock :data:`NEW`, ``own_clock_s``
    off the real one), written there before it was assigned the partition."""
    records: list[bytes] = []
    plain: list[bytes] = []  # the same log with every tick a plain probe
    acked: list[tuple[int, float]] = []  # (offset, acknowledged at: real time)
    own_acked: list[tuple[int, float]] = []
    last: dict[int, float] = {}  # per delivery, when what set its deadline last was appended
    t = 0.0
    for what, which, dt, ack_s in steps:
        t += dt
        if what in ("own", "owntick"):
            sent = floor_ms(t + own_clock_s) / 1000
            if sent <= 0:
                continue  # a monotonic clock never reads below 0
            known = [(o, at) for o, at in own_acked if at <= t]
            tick = None
            if what == "owntick" and known:
                o, at = known[which % len(known)]
                tick = (o, at + own_clock_s)
            if what == "own":
                own_acked.append((len(records), t + ack_s))
            records.append(beacon_record(sent, NEW, acked=tick))
            plain.append(beacon_record(sent, NEW))
            continue
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
    return records, plain, last, t


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
    records, plain, last, t = predecessor_log(steps, old_clock_s)
    now = t + read_after_s + new_clock_s
    with_ticks, without = replaying(len(records)), replaying(len(plain))
    replay(with_ticks, records, now)
    replay(without, plain, now)
    assert_taken_over_no_sooner(with_ticks, without, last, new_clock_s)


def assert_taken_over_no_sooner(
    taken_over: PartitionState, baseline: PartitionState, last: dict[int, float], clock_s: float
) -> None:
    """Once both replays are over: ``taken_over`` has every deadline ``baseline`` has, none
    later, and none before its marker was appended (``last``, real time) plus the lease, by
    the successor's clock ``clock_s`` off the real one."""
    taken_over.due(float("-inf"))  # the replay is over: takes over what it can
    baseline.due(float("-inf"))
    for which, appended in last.items():
        key = delivery_key(0, 1, 40 + which)
        taken, before = taken_over.deadline_of(key), baseline.deadline_of(key)
        assert (taken is None) == (before is None)
        if taken is None or before is None:
            continue
        assert taken <= before, "only ever brought forward"
        # (1e-6: the float arithmetic of this test, not of the tracker)
        assert taken - clock_s >= appended + LEASE_S - 1e-6, "never before the lease ran out"


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["S", "K", "E", "N", "probe", "tick", "own", "owntick"]),
            st.integers(0, 3), st.floats(0, 3), st.floats(0, 2),
        ),
        max_size=40,
    ),
    OFFSETS, st.floats(0, 1e5), st.floats(0, 20),
)  # fmt: skip
@example(  # its own beacon after a START: the START's lease ends by that beacon's ack
    [("S", 0, 1, 0), ("own", 0, 0, 0), ("owntick", 0, 1, 0)], 0.0, 5.0, 0.0,
)  # fmt: skip
def test_with_its_own_beacons_a_lease_taken_over_still_never_ends_early(
    steps: list[tuple[str, int, float, float]], old_clock_s: float, new_clock_s: float,
    read_after_s: float,
) -> None:  # fmt: skip
    """As above, the log holding the successor's own beacons too, some of them ticks: on
    its own clock they bound exactly when what came before them was on the broker."""
    records, plain, last, t = predecessor_log(steps, old_clock_s, new_clock_s)
    now = t + read_after_s + new_clock_s
    with_ticks, without = replaying(len(records), ClockBounds(own=NEW)), replaying(len(plain))
    replay(with_ticks, records, now)
    replay(without, plain, now)
    assert_taken_over_no_sooner(with_ticks, without, last, new_clock_s)


@settings(max_examples=500, deadline=None)
@given(
    STEPS, OFFSETS, OFFSETS, st.floats(0, 20),
    st.lists(
        st.tuples(st.floats(-30, 30), st.floats(0, 2), st.none() | st.floats(0, 2)), max_size=4
    ),
    OFFSETS,
)  # fmt: skip
@example(  # every beacon read the instant it was sent: the bounds are exact
    [("S", 0, 0, 0), ("probe", 0, 0, 0), ("tick", 0, 0, 0)], 100.0, 200.0, 0.0,
    [(0.0, 0.0, None), (0.0, 0.0, 0.0)], 300.0,
)  # fmt: skip
def test_with_beacons_a_lease_taken_over_still_never_ends_early(
    steps: list[tuple[str, int, float, float]], old_clock_s: float, new_clock_s: float,
    read_after_s: float, beacons: list[tuple[float, float, float | None]],
    third_clock_s: float,
) -> None:  # fmt: skip
    """As above, the successor having also read the predecessor's ``beacons``, each
    ``(sent, read after, via)`` in real time around the last record: a beacon is read after
    it was sent (by 0 to 2 s), directly, or (``via`` not ``None``) by a third replica whose
    clock is ``third_clock_s`` off, which passes its bound on in its next beacon, sent
    ``via`` later. Beacons only bring deadlines forward."""
    records, _, last, t = predecessor_log(steps, old_clock_s)
    now = t + read_after_s + new_clock_s
    clocks = ClockBounds(own=1)
    for sent, latency, via in beacons:
        sent_real = max(0.0, t + sent)
        if sent_real + min(old_clock_s, third_clock_s) < 0:
            continue  # a monotonic clock never reads below 0 (floor_ms would say 0)
        sent_ms = floor_ms(sent_real + old_clock_s)
        if via is None:
            read_at = sent_real + latency + new_clock_s
            if read_at <= now:
                clocks.observe(OLD, sent_ms, read_at)
            continue
        third = ClockBounds(own=9)
        third.observe(OLD, sent_ms, sent_real + latency + third_clock_s)
        relayed_real = sent_real + latency + via
        text = beacon_text(9, third.passed_on(relayed_real + third_clock_s))
        parsed = parse_beacon(floor_ms(relayed_real + third_clock_s), text)
        assert parsed is not None
        read_at = relayed_real + latency + new_clock_s
        if read_at <= now:
            clocks.observe(9, floor_ms(relayed_real + third_clock_s), read_at, parsed[1])
    with_beacons, with_ticks = replaying(len(records), clocks), replaying(len(records))
    replay(with_beacons, records, now)
    replay(with_ticks, records, now)
    assert_taken_over_no_sooner(with_beacons, with_ticks, last, new_clock_s)


# -- beacons ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("clock", "known", "acked", "text", "parsed"),
    [
        (0, {}, None, b"clock 0", (0, {}, None)),
        (2**32 - 1, None, None, b"clock 4294967295", (2**32 - 1, {}, None)),
        (7, {9: 1000.2, 11: -3.0004}, None, b"clock 7 9:1000200 11:-3000",
         (7, {9: 1000200, 11: -3000}, None)),
        (7, {9: 1.0}, (12, 4.0), b"clock 7 12@1000 9:1000", (7, {9: 1000}, (12, 4000))),
        (7, None, (12, 5.0004), b"clock 7", (7, {}, None)),  # acknowledged within its ms
    ],
)  # fmt: skip
def test_a_beacon_names_its_clock_passes_bounds_on_rounded_up_and_may_be_a_tick(
    clock: int,
    known: dict[int, float] | None,
    acked: tuple[int, float] | None,
    text: bytes,
    parsed: tuple[int, dict[int, int], tuple[int, int] | None],
) -> None:
    assert beacon_text(clock, known, 5000, acked) == text
    assert parse_beacon(5000, text) == parsed


@pytest.mark.parametrize("text", [b"", b"clock", b"clock ", b"clock x", b"clock -1", b"12 1000",
                                  b"clock 99999999999", b"clocks 5", b"clock 5 6", b"clock 5 6:",
                                  b"clock 5 6:1_0", b"clock 5 x:1", b"clock 5 6:--1",
                                  b"clock 5 1@6000", b"clock 5 1@2@3", b"clock 5 1@2 1@3",
                                  b"clock 5 x@1"])  # fmt: skip
def test_a_text_that_is_not_a_beacon_names_no_clock(text: bytes) -> None:
    assert parse_beacon(5000, text) is None


def test_clock_bounds_keep_the_closest_recent_bound() -> None:
    clocks = ClockBounds(own=1)
    assert clocks.bound(1, 0.0) == 0.0, "its own clock"
    assert clocks.bound(OLD, 0.0) is None, "no beacon read yet"
    clocks.observe(OLD, 5_000, 1005.5)  # sent at 5.0 there, read at 1005.5 here
    assert clocks.bound(OLD, 1006.0) == pytest.approx(1000.5)
    clocks.observe(OLD, 6_000, 1006.2)  # read sooner after it was sent: a closer bound
    assert clocks.bound(OLD, 1007.0) == pytest.approx(1000.2)
    clocks.observe(OLD, 7_000, 1008.0)  # read later: the closer one stays
    assert clocks.bound(OLD, 1008.0) == pytest.approx(1000.2)
    later = 1006.2 + handover.CLOCK_WINDOW_S
    assert clocks.bound(OLD, later) == pytest.approx(1000.2)
    assert clocks.bound(OLD, later + 0.1) is None, "too old to trust the clocks' drift"
    clocks.observe(OLD, 80_000, later + 0.1 + 1000.9 - 1000.9)  # a later, looser one
    assert clocks.bound(OLD, later + 0.1) == pytest.approx(later + 0.1 - 80.0)
    clocks.observe(1, 0, 5.0)
    assert clocks.bound(1, 5.0) == 0.0, "its own beacons say nothing"
    clocks.forget_stale(later + 0.2 + handover.CLOCK_WINDOW_S)
    assert clocks.bound(OLD, later + 0.2 + handover.CLOCK_WINDOW_S) is None


def beacon_record(
    sent_s: float,
    clock: int = OLD,
    known: dict[int, float] | None = None,
    acked: tuple[int, float] | None = None,
) -> bytes:
    text = beacon_text(clock, known, floor_ms(sent_s), acked)
    return encode_entries([(int(MarkerType.PROBE), 0, 0, floor_ms(sent_s), 0, 0, 0,
                            len(text))], [text])  # fmt: skip


def test_a_successor_that_read_its_predecessors_beacons_runs_leases_from_their_marker() -> None:
    """The predecessor's clock is 1000 s behind the successor's. Its beacons, read 0.3 s
    after they were sent, say so; its ticks, read in the replay long after, say only that
    it is at most 1032 s behind."""
    clocks = ClockBounds(own=1)
    own = PartitionState(PARTITION + 1, clocks=clocks)  # a partition it owned all along
    own.set_position(0)
    own.set_end_offset(0)
    own.on_record(0, beacon_record(2.0), 1002.3)
    assert own.stats["beacon_read"] == 1
    records = [
        marker(S, DELIVERY),  # 0: on the broker by 5.0 (the tick at 2 says so)
        probe_record(4.0),  # 1
        probe_record(5.0, acked=(1, 5.0)),  # 2
        probe_record(9.0, acked=(2, 8.0)),  # 3: the predecessor died soon after
    ]
    successor = replaying(len(records), clocks)
    replay(successor, records, 1040.0)  # taken over 31 s after the predecessor died
    # By the ticks alone: 5.0 + (1040 - 8.0) + lease. By the beacon: 5.0 + 1000.3 + lease.
    assert successor.next_deadline() == pytest.approx(1005.3 + LEASE_S + DRIFT_MARGIN_S)
    assert [d.delivery for d in successor.due(1040.0)] == [DELIVERY]
    ticks_only = replaying(len(records))
    replay(ticks_only, records, 1040.0)
    assert ticks_only.next_deadline() == pytest.approx(1037.0 + LEASE_S + DRIFT_MARGIN_S)


def test_a_beacon_read_in_a_replay_is_not_used() -> None:
    clocks = ClockBounds(own=1)
    state = replaying(2, clocks)
    state.on_record(0, beacon_record(2.0), 1002.3)  # read late, perhaps: says nothing
    assert state.stats["beacon_read"] == 1 and clocks.bound(OLD, 1002.3) is None


def test_bounds_passed_on_by_a_third_replica_count_added_to_the_bound_on_it() -> None:
    third = 9
    clocks = ClockBounds(own=1)
    clocks.observe(third, 500_000, 1000.25, {OLD: 2_000, 1: -7})  # it knew OLD; and us
    assert clocks.bound(third, 1000.25) == pytest.approx(500.25)
    assert clocks.bound(OLD, 1000.25) == pytest.approx(502.25)
    assert clocks.passed_on(1000.25) == {third: pytest.approx(500.25)}, "only its own"
    clocks.observe(OLD, 499_000, 1000.3)  # read directly, closer
    assert clocks.bound(OLD, 1000.3) == pytest.approx(501.3)
    assert clocks.bound(1, 1000.3) == 0.0


def test_a_successor_that_joined_after_its_predecessor_died_learns_its_clock_from_a_third() -> (
    None
):
    """The predecessor (OLD, 1000 s behind) died before this replica started; the replica
    that outlived it read its beacons and passes its bound on: this replica's replay ends
    first, and the deadlines come forward once that beacon is read."""
    clocks = ClockBounds(own=1)
    records = [
        marker(S, DELIVERY),  # 0
        probe_record(4.0),  # 1
        probe_record(5.0, acked=(1, 5.0)),  # 2
        probe_record(9.0, acked=(2, 8.0)),  # 3: then it died
    ]
    successor = replaying(len(records), clocks)
    replay(successor, records, 1020.0)
    assert successor.next_deadline() == pytest.approx(1017.0 + LEASE_S + DRIFT_MARGIN_S)
    # The third replica (9) is 500 s behind: its beacon, sent at 520.0 its time and read
    # 0.1 s later, says OLD is at most 500.2 s behind it.
    successor.on_record(4, beacon_record(520.0, 9, {OLD: 500.2}), 1020.1)
    assert clocks.bound(OLD, 1020.1) == pytest.approx(1000.3)
    assert successor.next_deadline() == pytest.approx(1005.3 + LEASE_S + DRIFT_MARGIN_S)
    assert successor.stats["lease_taken_over"] == 2


def test_after_the_wait_beacons_bring_no_deadline_forward() -> None:
    clocks = ClockBounds(own=1)
    records = [marker(S, DELIVERY), probe_record(4.0), probe_record(5.0, acked=(1, 5.0))]
    successor = replaying(len(records), clocks)
    replay(successor, records, 1020.0)
    before = successor.next_deadline()
    late = 1020.0 + handover.HANDOVER_WAIT_S + 0.1
    successor.on_record(3, beacon_record(520.0, 9, {OLD: 500.2}), late)
    successor.on_record(4, beacon_record(521.0, 9, {OLD: 400.0}), late + 0.1)
    assert successor.next_deadline() == before


def test_another_replicas_beacon_is_a_tick_for_what_came_before_it() -> None:
    """The predecessor (OLD) wrote its last KEEPALIVE after its last tick, then died. A third
    replica (9, 500 s behind this one) wrote a beacon there after it, saying its previous
    beacon, which followed the KEEPALIVE, was on the broker by 21.0 on its clock: so was the
    KEEPALIVE. This replica knows that clock from live beacons."""
    clocks = ClockBounds(own=1)
    clocks.observe(9, 20_000, 520.1)  # read live elsewhere: at most 500.1 s behind
    records = [
        marker(S, DELIVERY),  # 0
        probe_record(4.0),  # 1
        probe_record(5.0, acked=(1, 5.0)),  # 2: covers the START only
        marker(K, DELIVERY),  # 3: after OLD's last tick; then OLD died
        beacon_record(20.5, 9),  # 4: the third's beacon, acknowledged at 21.0 its time
        beacon_record(22.0, 9, acked=(4, 21.0)),  # 5
    ]
    successor = replaying(len(records), clocks)
    replay(successor, records, 530.0)
    assert successor.stats["tick_read"] == 2
    # The KEEPALIVE was on the broker by 21.0 + 500.1 here: its lease ends by then + lease.
    assert successor.next_deadline() == pytest.approx(521.1 + LEASE_S + DRIFT_MARGIN_S)
    without = replaying(len(records))
    replay(without, records, 530.0)
    assert without.next_deadline() == 530.0 + LEASE_S, "no live bound on 9's clock: afresh"
