"""tracker.held.HeldWatch: when a markers partition's reader is held below a growing high
watermark long enough to nudge it. Pure: a clock passed in, no broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracker.held import HeldWatch

AFTER_S = 1.0


def watch_through(steps: list[tuple[float, int, int | None]]) -> list[bool]:
    """``steps``: (now, position, highwater) of partition 0; what each observe() said,
    with a nudge noted whenever one was asked for."""
    watch = HeldWatch(AFTER_S)
    said = []
    for now, position, highwater in steps:
        nudge = watch.observe(0, position, highwater, now)
        if nudge:
            watch.nudged(0, now)
        said.append(nudge)
    return said


CASES = {
    "held below a growing high watermark": (
        [(0.0, 10, 12), (0.5, 10, 15), (1.0, 10, 18)],
        [False, False, True],
    ),
    "not yet long enough": ([(0.0, 10, 12), (0.9, 10, 18)], [False, False]),
    "caught up: nothing withheld": ([(0.0, 10, 10), (2.0, 10, 10)], [False, False]),
    "moving: reading is just slow": (
        [(0.0, 10, 50), (0.6, 20, 60), (1.2, 30, 70), (1.8, 40, 80)],
        [False] * 4,
    ),
    # No answer grew the high watermark: a network stall, not a held transaction.
    "high watermark not growing": ([(0.0, 10, 12), (3.0, 10, 12)], [False, False]),
    "no high watermark yet": ([(0.0, 10, None), (3.0, 10, None)], [False, False]),
    "one nudge per interval": (
        [(0.0, 10, 12), (1.0, 10, 13), (1.5, 10, 14), (2.0, 10, 15), (2.5, 10, 16)],
        [False, True, False, True, False],
    ),
    "moving again starts the clock again": (
        [(0.0, 10, 12), (1.0, 10, 13), (1.2, 13, 14), (2.1, 13, 15), (2.3, 13, 16)],
        [False, True, False, False, True],
    ),
    # Held since it was last seen not held: caught up at 0.9.
    "caught up in between starts the clock again": (
        [(0.0, 10, 12), (0.9, 12, 12), (1.5, 12, 14), (1.8, 12, 15), (2.0, 12, 16)],
        [False, False, False, False, True],
    ),
    # A new reader's first answer may report less than the last one did.
    "a lower high watermark starts the clock again": (
        [(0.0, 10, 40), (0.5, 10, 12), (1.2, 10, 13), (1.6, 10, 14)],
        [False, False, False, True],
    ),
}


@pytest.mark.parametrize("steps, expected", CASES.values(), ids=CASES.keys())
def test_when_to_nudge(steps: list[tuple[float, int, int | None]], expected: list[bool]) -> None:
    assert watch_through(steps) == expected


def test_partitions_are_watched_apart() -> None:
    watch = HeldWatch(AFTER_S)
    assert not watch.observe(0, 10, 12, 0.0)
    assert not watch.observe(1, 5, 5, 0.5)
    assert watch.observe(0, 10, 13, 1.0)
    watch.nudged(0, 1.0)
    assert not watch.observe(1, 5, 9, 1.2)
    assert watch.observe(1, 5, 10, 1.5)
    assert not watch.observe(0, 10, 14, 1.5)


def test_a_forgotten_partition_starts_afresh() -> None:
    watch = HeldWatch(AFTER_S)
    watch.observe(0, 10, 12, 0.0)
    watch.nudged(0, 0.0)
    watch.forget(0)
    assert not watch.observe(0, 10, 13, 5.0)
    assert watch.observe(0, 10, 14, 6.0)


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="after_s"):
        HeldWatch(0)


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 0.7),  # time since the last step
            st.integers(0, 3),  # how far the reader moved
            st.integers(-2, 5),  # how far the high watermark moved
        ),
        max_size=60,
    )
)
def test_nudges_only_when_held_and_at_most_once_per_interval(
    moves: list[tuple[float, int, int]],
) -> None:
    watch = HeldWatch(AFTER_S)
    now, position, highwater = 0.0, 0, 0
    last_nudge = None
    moved_at = 0.0
    for dt, dp, dh in moves:
        now += dt
        if dp:
            moved_at = now
        position += dp
        highwater = max(position, highwater + dh)
        if watch.observe(0, position, highwater, now):
            assert highwater > position
            assert now - moved_at >= AFTER_S
            assert last_nudge is None or now - last_nudge >= AFTER_S
            watch.nudged(0, now)
            last_nudge = now
