"""When a markers record was written at the latest (tracker.dating.WriteDates), and what a
consumer's claim read late then counts for (tracker.readers.LiveReaders)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.reads import READS_HEADER
from tracker.dating import WriteDates
from tracker.readers import LATELY_S, LiveReaders


def test_a_record_is_dated_by_the_first_high_watermark_seen_past_it() -> None:
    dates = WriteDates(window_s=10.0)
    dates.observe(0, 100, 1.0)
    dates.observe(0, 100, 1.5)  # the same end again: still there by 1.0
    dates.observe(0, 140, 2.0)
    dates.observe(0, 200, 3.0)
    assert [dates.latest(0, offset, now=4.0) for offset in (99, 100, 139, 140, 199)] == [
        1.0,
        2.0,
        2.0,
        3.0,
        3.0,
    ]
    assert dates.latest(0, 200, now=4.0) == 4.0, "past every end seen: as new as the read"
    assert dates.latest(1, 5, now=4.0) == 4.0, "a partition never seen: as new as the read"


def test_records_below_an_end_seen_longer_ago_than_the_window_are_not_dated() -> None:
    dates = WriteDates(window_s=1.0)
    dates.observe(0, 100, 1.0)
    dates.observe(0, 150, 1.6)
    dates.observe(0, 150, 2.5)  # 1.0 is over a second ago now: below 100 is old
    assert dates.latest(0, 99, now=2.5) is None
    assert dates.latest(0, 100, now=2.5) == 1.6
    dates.observe(0, 150, 3.0)
    assert dates.latest(0, 149, now=3.0) is None
    assert dates.latest(0, 150, now=3.0) == 3.0


def test_a_high_watermark_that_goes_back_starts_the_partition_afresh() -> None:
    dates = WriteDates(window_s=1.0)
    dates.observe(0, 100, 1.0)
    dates.observe(0, 100, 5.0)  # floor 100
    dates.observe(0, 10, 5.5)  # recreated
    assert dates.latest(0, 5, now=5.6) == 5.5
    assert dates.latest(0, 50, now=5.6) == 5.6


def test_the_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        WriteDates(window_s=0)


# A log written over time, and a tracker that sees its end now and then, late or not.
steps = st.lists(
    st.tuples(
        st.floats(0.0, 0.5),  # time passing
        st.integers(0, 5),  # records written then
        st.booleans(),  # the tracker sees the end then
        st.integers(0, 20),  # how many records short of it (an end seen a while ago)
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.floats(0.2, 3.0))
def test_a_record_is_never_dated_before_it_was_written(
    history: list[tuple[float, int, bool, int]], window_s: float
) -> None:
    dates = WriteDates(window_s)
    written: list[float] = []  # offset -> when written
    now = 0.0
    seen_end = 0
    for passing, count, looks, short in history:
        now += passing
        written += [now] * count
        if looks:
            # A fetch answered a while ago: an end at most that of now, never below the
            # one seen before (ends only grow).
            seen_end = max(seen_end, len(written) - short)
            dates.observe(0, seen_end, now)
    previous: float | None = None
    for offset, at in enumerate(written):
        latest = dates.latest(0, offset, now)
        if latest is None:
            assert at < now - window_s + 1e-9, "only what was written before the window"
        else:
            assert at <= latest <= now
        if previous is not None:
            assert latest is not None and latest >= previous, "later offsets, later dates"
        previous = latest


def test_a_claim_read_late_counts_from_when_it_was_written() -> None:
    """A tracker 2.9 s behind its markers reads the last claim of a consumer killed at
    t = 10: dated by the end it saw at 10.1, that claim is not news at 12.9, and copies go
    to a reader heard since."""
    dates, readers = WriteDates(window_s=1.0), LiveReaders(fresh_s=1.0)
    for tick in range(30):  # the end of the partition, seen every 0.1 s
        dates.observe(0, 100 + 10 * tick, 10.1 + 0.1 * tick)
    dead_claim, live_claim = 100, 385  # written by 10.1 and by 12.9
    now = 13.0
    for offset, value in ((dead_claim, b"orders 3"), (live_claim, b"orders 5")):
        at = dates.latest(0, offset, now)
        if at is not None:
            readers.note([(READS_HEADER, value)], at)
    assert readers.live("orders", now, LATELY_S) == {5}
    assert readers.live("orders", now) == {5}


def test_a_claim_dated_earlier_never_makes_a_later_one_older() -> None:
    readers = LiveReaders(fresh_s=1.0)
    readers.note([(READS_HEADER, b"orders 3")], 10.0)
    readers.note([(READS_HEADER, b"orders 3")], 9.2)  # an older claim, read after it
    assert readers.live("orders", 10.5, within_s=0.6) == {3}
