"""tracker.stall: when reading a markers partition has stood still short of its end."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tracker.stall import Change, Stall

AFTER_S = 30.0


Round = tuple[float, int | None, int | None]


def run(rounds: list[Round]) -> list[Change | None]:
    stall = Stall(AFTER_S)
    return [stall.observe(position, highwater, now) for now, position, highwater in rounds]


S, R = Change.STALLED, Change.RESUMED

CASES: dict[str, tuple[list[Round], list[Change | None]]] = {
    "at the end is never stalled": ([(0, 5, 5), (40, 5, 5), (90, 5, 5)], [None, None, None]),
    "moving is never stalled": ([(0, 1, 9), (20, 2, 9), (40, 3, 9), (60, 4, 9)], [None] * 4),
    "still below the end for after_s": ([(0, 3, 9), (29.9, 3, 9), (30, 3, 9), (60, 3, 9)],
                                        [None, None, S, None]),
    "moves again": ([(0, 3, 9), (30, 3, 9), (31, 4, 9)], [None, S, R]),
    "the end comes down to it": ([(0, 3, 9), (30, 3, 9), (31, 3, 3)], [None, S, R]),
    "a growing end alone is no progress": ([(0, 3, 9), (15, 3, 12), (30, 3, 20)],
                                           [None, None, S]),
    "unknown end is not stalled": ([(0, 3, None), (40, 3, None)], [None, None]),
    "unknown position is not stalled": ([(0, None, 9), (40, None, 9)], [None, None]),
    "a short stop, then a long one": ([(0, 3, 9), (20, 4, 9), (45, 4, 9), (50, 4, 9)],
                                      [None, None, None, S]),
}  # fmt: skip


def test_table() -> None:
    for name, (rounds, expected) in CASES.items():
        assert run(rounds) == expected, name


def test_stalled_for_counts_from_the_last_move() -> None:
    stall = Stall(AFTER_S)
    stall.observe(3, 9, 100.0)
    assert stall.stalled_for(120.0) == 0.0  # not yet past after_s
    stall.observe(3, 9, 131.0)
    assert stall.stalled_for(140.0) == 40.0
    stall.observe(4, 9, 141.0)
    assert stall.stalled_for(150.0) == 0.0


rounds = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=20),
        st.one_of(st.none(), st.integers(0, 5)),
        st.one_of(st.none(), st.integers(0, 5)),
    ),
    max_size=40,
)


@given(rounds)
def test_changes_alternate_and_follow_the_rule(
    steps: list[tuple[float, int | None, int | None]],
) -> None:
    stall = Stall(AFTER_S)
    now, last_change = 0.0, Change.RESUMED
    moved_at, last_position = 0.0, object()
    for step, position, highwater in steps:
        now += step
        behind = position is not None and highwater is not None and position < highwater
        if position != last_position or not behind:
            moved_at, last_position = now, position
        change = stall.observe(position, highwater, now)
        if change is not None:
            assert change is not last_change  # STALLED and RESUMED alternate
            last_change = change
        # Stalled exactly when behind and unmoved for after_s (reported once crossing it).
        assert stall.stalled == (behind and now - moved_at >= AFTER_S)


def test_behind_for_is_how_long_the_position_stood_still_short_of_the_end() -> None:
    stall = Stall(AFTER_S)
    assert stall.behind_for(0) == 0.0, "nothing observed yet"
    stall.observe(3, 9, 10.0)
    assert stall.behind_for(12.0) == 2.0, "behind, not yet stalled"
    stall.observe(3, 12, 14.0)
    assert stall.behind_for(14.0) == 4.0, "a growing end is no progress"
    stall.observe(4, 12, 15.0)
    assert stall.behind_for(15.0) == 0.0, "it moved"
    stall.observe(4, 4, 16.0)
    assert stall.behind_for(20.0) == 0.0, "at the end"
    stall.observe(4, None, 21.0)
    assert stall.behind_for(22.0) == 0.0, "end unknown"
