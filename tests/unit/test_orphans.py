"""Who holds which markers partition, from the owns entries next to the beacons, and which
partitions a live replica takes up from a silent owner (tracker.orphans): pure, no broker."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kmq.markers import MarkerType, encode_entries
from tracker.handover import beacon_text
from tracker.orphans import (
    MAX_OWNED,
    STALE_VIEW_S,
    OwnerWatch,
    owns_text,
    parse_owns,
    parse_ready,
    ready_text,
)
from tracker.state import PartitionState, floor_ms

SILENCE_S = 2.0
ME, OTHER, THIRD = 11, 22, 33


@given(
    st.integers(0, 2**32 - 1),
    st.sets(st.integers(0, 10**9 - 1), max_size=50),
)
def test_an_owns_text_names_its_clock_and_partitions(clock: int, partitions: set[int]) -> None:
    assert parse_owns(owns_text(clock, partitions)) == (clock, frozenset(partitions))


def test_an_owns_text_names_at_most_max_owned_partitions() -> None:
    parsed = parse_owns(owns_text(1, range(MAX_OWNED + 10)))
    assert parsed is not None and parsed[1] == frozenset(range(MAX_OWNED))


@pytest.mark.parametrize(
    "text",
    [b"", b"owns", b"owns 12", b"owns x 1", b"owns 1 a", b"owns 1 1,,2", b"owns 1 -1",
     b"owns 12345678901 1", b"owns 1 1234567890", b"clock 12 3:4", b"12 34", b"OWNS 1 2"],
)  # fmt: skip
def test_a_text_that_is_not_an_owns_entry_names_nothing(text: bytes) -> None:
    assert parse_owns(text) is None


def test_owns_of_nothing_is_still_an_owns_entry() -> None:
    assert parse_owns(owns_text(5, [])) == (5, frozenset())


def watch(silence_s: float = SILENCE_S) -> OwnerWatch:
    return OwnerWatch(ME, silence_s)


def test_an_owner_heard_lately_leaves_nothing_to_adopt() -> None:
    w = watch()
    for t in range(10):
        w.heard(OTHER, frozenset({1, 3}), t, t + 0.05)
        w.heard(ME, frozenset({0, 2}), t + 0.5, t + 0.6)
    assert w.orphans(10.0, {0, 2}) == []


def test_a_silent_owners_partitions_are_adopted_once_own_beacons_show_the_silence() -> None:
    w = watch()
    w.heard(OTHER, frozenset({1, 3}), 0.0, 1.0)  # last heard at 1.0 (this replica's clock)
    w.heard(ME, frozenset({0, 2}), 2.0, 2.1)
    assert w.orphans(2.1, {0, 2}) == []
    w.heard(ME, frozenset({0, 2}), 2.999, 3.1)  # sent 1.999 s after: not yet
    assert w.orphans(3.1, {0, 2}) == []
    w.heard(ME, frozenset({0, 2}), 3.0, 3.2)
    assert w.orphans(3.2, {0, 2}) == [1, 3]
    assert w.orphans(3.2, {0, 1, 2, 3}) == [], "held already"


def test_a_replica_that_reads_nothing_new_adopts_nothing() -> None:
    """Its own beacons not read back (it is behind, or the broker stalls): however long the
    clock runs, the silence of others is not known to be theirs."""
    w = watch()
    w.heard(OTHER, frozenset({1}), 0.0, 1.0)
    w.heard(ME, frozenset({0}), 1.5, 1.6)
    assert w.orphans(100.0, {0}) == []


def test_an_owner_heard_again_cancels_the_adoption() -> None:
    w = watch()
    w.heard(OTHER, frozenset({1}), 0.0, 1.0)
    w.heard(OTHER, frozenset({1}), 2.5, 2.9)  # late, but heard
    w.heard(ME, frozenset({0}), 3.0, 3.2)
    assert w.orphans(3.2, {0}) == []


def test_a_partition_a_new_owner_names_is_not_adopted_from_its_old_one() -> None:
    w = watch()
    w.heard(OTHER, frozenset({1, 3}), 0.0, 1.0)
    w.heard(THIRD, frozenset({3}), 2.5, 2.6)  # the group gave partition 3 to a third
    w.heard(THIRD, frozenset({3}), 4.5, 4.6)
    w.heard(ME, frozenset({0}), 5.0, 5.1)  # partition 1 quiet for twice the silence
    assert w.orphans(5.1, {0}) == [1]


def test_a_partition_this_replica_named_last_is_never_adopted_back() -> None:
    """It gave it up itself: a cooperative rebalance revokes it, and seconds later assigns
    it to another replica, which names it only then."""
    w = watch()
    w.heard(OTHER, frozenset({1, 2}), 0.0, 0.5)
    w.heard(ME, frozenset({0, 1}), 1.0, 1.1)  # then it gave partition 1 up
    w.heard(ME, frozenset({0}), 2.0, 2.1)
    w.heard(ME, frozenset({0}), 9.0, 9.1)
    assert w.orphans(9.1, {0}) == [2], "not 1"


def test_a_partition_its_live_owner_let_go_is_left_to_the_group() -> None:
    """Fenced on it by an adopter, say: the group (FenceWatch) gives it back."""
    w = watch()
    w.heard(OTHER, frozenset({1, 3}), 0.0, 1.0)
    for t in (2.0, 3.0, 4.0):
        w.heard(OTHER, frozenset({3}), t, t + 0.1)
    w.heard(ME, frozenset({0}), 4.0, 4.2)
    assert w.orphans(4.2, {0}) == []


def test_a_partition_named_longer_ago_than_the_window_is_left_to_the_group() -> None:
    w = OwnerWatch(ME, SILENCE_S, window_s=10.0)
    w.heard(OTHER, frozenset({1}), 0.0, 1.0)
    w.heard(ME, frozenset({0}), 11.5, 11.6)
    assert w.orphans(11.6, {0}) == []
    w.forget_stale(11.6)
    w.heard(ME, frozenset({0}), 12.5, 12.6)
    assert w.orphans(12.6, {0}) == []


def test_a_partition_is_held_elsewhere_while_another_replica_names_it_lately() -> None:
    w = watch()
    w.heard(ME, frozenset({0, 1}), 0.0, 0.1)
    w.heard(OTHER, frozenset({1, 3}), 0.5, 0.6)  # the adopter names 1 too
    w.heard(ME, frozenset({0}), 1.0, 1.1)  # this replica let 1 go (fenced)
    assert w.held_elsewhere(1.2) == {1, 3}
    w.heard(OTHER, frozenset({3}), 2.0, 2.1)  # the adopter let 1 go as well
    w.heard(ME, frozenset({0}), 2.5, 2.6)
    assert w.held_elsewhere(2.7) == {1, 3}, "named 1.9 s before the newest own beacon"
    w.heard(ME, frozenset({0}), 2.7, 2.8)
    assert w.held_elsewhere(2.9) == {3}
    w.heard(ME, frozenset({0}), 5.0, 5.1)  # and nothing more of OTHER: silent too
    assert w.held_elsewhere(5.2) == set()


def test_a_replica_that_reads_nothing_new_knows_of_no_partition_held_elsewhere() -> None:
    w = watch()
    w.heard(OTHER, frozenset({1}), 0.5, 0.6)
    w.heard(ME, frozenset({0}), 1.0, 1.1)
    assert w.held_elsewhere(1.5) == {1}
    # A turn of a few seconds without reading (a slow redelivery round) changes nothing.
    assert w.held_elsewhere(1.0 + 3 * SILENCE_S) == {1}
    # No own beacon read back for long: whether OTHER still lives is not known here.
    assert w.held_elsewhere(1.0 + STALE_VIEW_S - 0.01) == {1}
    assert w.held_elsewhere(1.0 + STALE_VIEW_S) == set()


def test_partitions_the_group_just_gave_to_another_are_not_adopted_until_it_is_silent() -> None:
    """The group has just moved a dead replica's partitions to a new member, which names
    them only at its first beacon: they are not taken up from the dead one meanwhile."""
    w = watch()
    w.heard(OTHER, frozenset({0, 2}), 0.0, 1.0)  # then OTHER is killed
    w.heard(ME, frozenset({1, 3}), 3.0, 3.1)
    assert w.orphans(3.1, {1, 3}) == [0, 2], "silent for the silence: adopted"
    w.reassigned(3.2, {1, 3})  # the assignment gives 0 and 2 to another member
    w.heard(ME, frozenset({1, 3}), 5.1, 5.2)  # sent 1.9 s after the assignment
    assert w.orphans(5.2, {1, 3}) == []
    for t in (4.0, 5.0, 6.0, 7.0, 8.0):  # the new owner names them at every beacon
        w.heard(THIRD, frozenset({0, 2}), t, t + 1.3)
    w.heard(ME, frozenset({1, 3}), 9.0, 9.1)
    assert w.orphans(9.1, {1, 3}) == []


def test_partitions_whose_new_owner_never_names_them_are_adopted_after_the_silence() -> None:
    """The member the group gave them to was killed too: adopted once the silence has run
    from the assignment, judged on this replica's own beacons as ever."""
    w = watch()
    w.heard(OTHER, frozenset({0, 2}), 0.0, 1.0)
    w.reassigned(3.2, {1, 3})
    w.heard(ME, frozenset({1, 3}), 5.1, 5.2)
    assert w.orphans(5.2, {1, 3}) == []
    w.heard(ME, frozenset({1, 3}), 5.2, 5.3)
    assert w.orphans(5.3, {1, 3}) == [0, 2]
    assert w.orphans(5.3, {0, 1, 2, 3}) == [], "the group gave them here after all"


def test_an_assignment_does_not_bring_back_partitions_named_longer_ago_than_the_window() -> None:
    w = OwnerWatch(ME, SILENCE_S, window_s=10.0)
    w.heard(OTHER, frozenset({1}), 0.0, 1.0)
    w.reassigned(11.5, {0})
    w.heard(ME, frozenset({0}), 14.0, 14.1)
    assert w.orphans(14.1, {0}) == []


def views(
    dead: int, survivors: list[int], partitions: frozenset[int], quiet_s: float
) -> dict[int, list[int]]:
    """What each survivor adopts ``quiet_s`` after it last heard ``dead`` name
    ``partitions``, every survivor having heard every other hold a partition of its own."""
    out = {}
    for me in survivors:
        w = OwnerWatch(me, SILENCE_S)
        w.heard(dead, partitions, 0.0, 1.0)
        for i, other in enumerate(survivors):
            w.heard(other, frozenset({1000 + i}), 1.0 + quiet_s - 0.5, 1.0 + quiet_s - 0.4)
        w.heard(me, frozenset({1000 + survivors.index(me)}), 1.0 + quiet_s, 1.0 + quiet_s + 0.1)
        out[me] = w.orphans(1.0 + quiet_s + 0.1, {1000 + survivors.index(me)})
    return out


@given(
    st.lists(st.integers(1, 2**32 - 1), min_size=2, max_size=6, unique=True),
    st.frozensets(st.integers(0, 99), min_size=1, max_size=20),
    # Not up to twice the silence: 1.0 + 3.9999999999999996 rounds to 5.0, and the
    # fallback then rightly lets every replica adopt.
    st.floats(SILENCE_S, 2 * SILENCE_S - 0.001),
)
@example([1, 2, 3], frozenset({0}), 2 * SILENCE_S - 0.001)
@example([1, 2, 3], frozenset({0}), SILENCE_S)
def test_live_replicas_that_hear_the_same_adopt_each_partition_once(
    clocks: list[int], partitions: frozenset[int], quiet_s: float
) -> None:
    dead, survivors = clocks[0], clocks[1:]
    adopted = views(dead, survivors, partitions, quiet_s)
    for partition in partitions:
        assert sum(partition in got for got in adopted.values()) == 1


def test_after_twice_the_silence_every_live_replica_adopts() -> None:
    adopted = views(1, [2, 3, 4], frozenset({7}), 2 * SILENCE_S)
    assert all(got == [7] for got in adopted.values())


def test_a_replica_that_holds_nothing_is_no_candidate() -> None:
    """It reads no markers partition, so hears no beacon: the others do not wait for it."""
    for idle in range(1, 200):
        w = OwnerWatch(ME, SILENCE_S)
        w.heard(OTHER, frozenset({1}), 0.0, 1.0)
        w.heard(idle + 100, frozenset(), 2.5, 2.6)
        w.heard(ME, frozenset({0}), 3.0, 3.2)
        assert w.orphans(3.2, {0}) == [1]


def owns_record(clock: int, partitions: set[int], sent_s: float, partition: int = 0) -> bytes:
    probe, sent_ms = int(MarkerType.PROBE), floor_ms(sent_s)
    beacon, owns = beacon_text(clock, None, sent_ms), owns_text(clock, partitions)
    return encode_entries(
        [(probe, 0, partition, sent_ms, 0, 0, 0, len(beacon)),
         (probe, 0, partition, sent_ms, 0, 0, 0, len(owns))],
        [beacon, owns],
    )  # fmt: skip


def test_a_partition_state_tells_its_owner_watch_what_it_reads_live_not_in_a_replay() -> None:
    w = watch()
    state = PartitionState(0, probe_nonce=ME, owners=w)
    state.set_position(0)
    state.set_end_offset(1)
    state.on_record(0, owns_record(OTHER, {5}, 0.5), 1.0)  # replayed: old news
    assert state.stats["owns_read"] == 0
    state.on_record(1, owns_record(OTHER, {1}, 1.5), 2.0)
    state.on_record(2, owns_record(ME, {0}, 4.5), 4.6)
    assert state.stats["owns_read"] == 2 and state.stats["beacon_read"] == 3
    assert w.orphans(4.6, {0}) == [1]


def test_a_replica_before_owns_entries_reads_one_as_a_probe_it_does_not_know() -> None:
    state = PartitionState(0, probe_nonce=ME)  # no owner watch: as before tracker.orphans
    state.set_position(0)
    state.set_end_offset(0)
    state.on_record(0, owns_record(OTHER, {1}, 1.0), 1.5)
    assert state.stats["beacon_read"] == 1 and state.stats["owns_read"] == 0
    assert state.stats["bad_marker"] == 0


def formed(w: OwnerWatch, at: float = 10.0) -> None:
    """This replica's own beacon, sent at ``at``, read back at once."""
    w.heard(ME, frozenset({0}), at, at)


@pytest.mark.parametrize(
    ("entries", "clear"),
    [
        ([], True),  # nobody else names it
        ([(OTHER, {5}, 9.0, 9.5)], False),  # a live replica holds it
        ([(OTHER, {5}, 9.0, 9.5), (OTHER, {1}, 9.8, 9.9)], True),  # and let it go
        ([(OTHER, {1}, 9.8, 9.9), (OTHER, {5}, 9.0, 9.95)], True),  # older, read later
        ([(OTHER, {5}, 9.0, 9.5), (OTHER, {5, 1}, 9.8, 9.9)], False),  # holds it still
        ([(OTHER, {5}, 7.0, 7.5)], True),  # silent for 2.5 s: gone (adoption's silence)
        ([(OTHER, {5}, 7.0, 7.5), (THIRD, {1}, 9.0, 9.9)], True),
        ([(OTHER, {1}, 9.0, 9.9), (THIRD, {5}, 9.0, 9.9)], False),  # another holds it
        ([(ME, {5}, 9.0, 9.0)], True),  # this replica's own naming
    ],
)  # fmt: skip
def test_a_partition_is_clear_to_claim_once_no_live_replica_names_it_last(
    entries: list[tuple[int, set[int], float, float]], clear: bool
) -> None:
    w = watch()
    for clock, partitions, sent, read in entries:
        w.heard(clock, frozenset(partitions), sent, read)
    formed(w)
    assert w.clear_to_claim(5, 10.1) is clear


def test_nothing_is_clear_to_claim_before_an_own_beacon_is_read_back_or_once_that_is_old() -> None:
    w = watch()
    assert not w.clear_to_claim(5, 10.0), "no view formed yet"
    formed(w)
    assert w.clear_to_claim(5, 10.0 + STALE_VIEW_S - 0.1)
    assert not w.clear_to_claim(5, 10.0 + STALE_VIEW_S), "a view too old to tell"


def test_a_replica_forgotten_as_stale_names_nothing() -> None:
    w = OwnerWatch(ME, SILENCE_S, window_s=30.0)
    w.heard(OTHER, frozenset({5}), 0.0, 1.0)
    w.forget_stale(40.0)
    formed(w, 40.0)
    assert w.clear_to_claim(5, 40.0)


@given(
    st.integers(0, 2**32 - 1),
    st.sets(st.integers(0, 10**9 - 1), max_size=50),
)
def test_a_ready_text_names_its_clock_and_partitions(clock: int, partitions: set[int]) -> None:
    text = ready_text(clock, partitions)
    assert parse_ready(text) == (clock, frozenset(partitions))
    assert parse_owns(text) is None, "never taken for an owns entry"
    assert parse_ready(owns_text(clock, partitions)) is None


@pytest.mark.parametrize("text", [b"", b"ready", b"ready 1 a", b"ready x 1", b"owns 1 2"])
def test_a_text_that_is_not_a_ready_entry_names_nothing(text: bytes) -> None:
    assert parse_ready(text) is None


@pytest.mark.parametrize(
    ("owns", "ready", "expected"),
    [
        ([(OTHER, {5, 6}, 9.0)], [], {5, 6}),  # writes no ready entry: a replica before them
        ([(OTHER, {5, 6}, 9.0)], [(OTHER, set(), 9.0)], set()),  # replaying both
        ([(OTHER, {5, 6}, 9.0)], [(OTHER, {6}, 9.0)], {6}),
        ([(OTHER, {5, 6}, 9.0)], [(OTHER, {6}, 9.0), (OTHER, set(), 8.0)], {6}),  # older
        ([(OTHER, {5}, 9.0)], [(OTHER, {5, 6}, 9.0)], {5}),  # ready, but not named now
        ([(OTHER, {5}, 9.0), (OTHER, set(), 9.5)], [(OTHER, {5}, 9.0)], set()),  # let go
        ([(OTHER, {5}, 7.0)], [(OTHER, {5}, 7.0)], set()),  # silent past the silence
        ([(ME, {5}, 9.0)], [(ME, {5}, 9.0)], set()),  # this replica's own
        ([(OTHER, {5}, 9.0), (THIRD, {6}, 9.0)], [(THIRD, set(), 9.0)], {5}),
    ],
)  # fmt: skip
def test_a_partition_is_ready_elsewhere_once_a_live_replica_names_it_replayed(
    owns: list[tuple[int, set[int], float]],
    ready: list[tuple[int, set[int], float]],
    expected: set[int],
) -> None:
    w = watch()
    for clock, partitions, sent in owns:
        w.heard(clock, frozenset(partitions), sent, sent + 0.5)
    for clock, partitions, sent in ready:
        w.heard_ready(clock, frozenset(partitions), sent, sent + 0.5)
    formed(w)
    assert w.ready_elsewhere(10.1) == expected
    assert w.ready_elsewhere(10.0 + STALE_VIEW_S) == set(), "a view too old to tell"


def test_a_replica_forgotten_as_stale_is_ready_for_nothing() -> None:
    w = OwnerWatch(ME, SILENCE_S, window_s=30.0)
    w.heard(OTHER, frozenset({5}), 0.0, 1.0)
    w.heard_ready(OTHER, frozenset({5}), 0.0, 1.0)
    w.forget_stale(40.0)
    w.heard(OTHER, frozenset({5}), 39.0, 39.5)  # back, and replaying it
    w.heard_ready(OTHER, frozenset(), 39.0, 39.5)
    formed(w, 40.0)
    assert w.ready_elsewhere(40.0) == set()


def test_a_partition_state_passes_ready_entries_read_live_to_its_owner_watch() -> None:
    w = watch()
    state = PartitionState(0, probe_nonce=ME, owners=w)
    state.set_position(0)
    state.set_end_offset(1)

    def record(sent_s: float, ready: set[int]) -> bytes:
        owns, text = owns_text(OTHER, {5}), ready_text(OTHER, ready)
        entries = [
            (int(MarkerType.PROBE), 0, 0, floor_ms(sent_s), 0, 0, 0, len(owns)),
            (int(MarkerType.PROBE), 0, 0, floor_ms(sent_s), 0, 0, 0, len(text)),
        ]
        return encode_entries(entries, [owns, text])

    state.on_record(0, record(0.5, {5}), 1.0)  # replayed: old news
    state.on_record(1, record(8.0, set()), 9.0)
    formed(w)
    assert w.ready_elsewhere(10.0) == set()
    state.on_record(2, record(9.5, {5}), 9.9)
    assert w.ready_elsewhere(10.0) == {5}
    assert state.stats["bad_marker"] == 0
