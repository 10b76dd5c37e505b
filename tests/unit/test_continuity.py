"""kmq.continuity: a poll that skips records is read again; a real hole is accepted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.continuity import Continuity


@pytest.mark.parametrize(
    ("reads", "answers"),
    [
        # contiguous reads: nothing to do
        ([(0, 4), (5, 9), (10, 10)], [None, None, None]),
        # a skip: read again from where the last read ended; the records come back
        ([(0, 4), (8, 9), (5, 9)], [None, 5, None]),
        # a hole (a transaction marker at 5): the same gap twice is accepted
        ([(0, 4), (6, 9), (6, 9), (10, 12)], [None, 5, None, None]),
        # going back (a reset to the committed offset) is never a gap
        ([(10, 14), (3, 8), (9, 9)], [None, None, None]),
        # the first read of a partition has nothing to compare with
        ([(42, 50)], [None]),
        # a read that skips even more than the suspected gap is read again
        ([(0, 4), (7, 9), (9, 9), (7, 9)], [None, 5, 5, None]),
        # a smaller gap than the suspected one: two reads agree there is nothing before 7
        ([(0, 4), (9, 9), (7, 9), (10, 11)], [None, 5, None, None]),
    ],
)
def test_reads(reads: list[tuple[int, int]], answers: list[int | None]) -> None:
    c: Continuity[str] = Continuity()
    assert [c.read("p", first, last) for first, last in reads] == answers


def test_a_gap_within_the_holes_allowed_is_not_read_again() -> None:
    c: Continuity[str] = Continuity()
    c.read("p", 0, 4, holes=1)
    assert c.read("p", 6, 9, holes=1) is None  # one transaction marker at 5
    assert c.read("p", 12, 12, holes=1) == 10  # two missing: read again
    assert c.reread == 1


def test_counts_rereads_and_recoveries() -> None:
    c: Continuity[str] = Continuity()
    c.read("p", 0, 4)
    assert c.read("p", 7, 9) == 5
    c.read("p", 5, 9)  # the skipped records came back
    assert (c.reread, c.recovered) == (1, 1)
    assert c.read("p", 12, 12) == 10
    c.read("p", 12, 12)  # a hole: same gap again
    assert (c.reread, c.recovered) == (2, 1)


def test_a_seek_sets_the_expectation() -> None:
    c: Continuity[str] = Continuity()
    c.read("p", 0, 9)
    c.moved("p", 3)  # the consumer reads 3.. again
    assert c.read("p", 3, 5) is None
    c.moved("p", 20)
    assert c.read("p", 20, 21) is None
    assert c.expected("p") == 22


def test_seeking_to_read_a_gap_again_keeps_it_suspect() -> None:
    c: Continuity[str] = Continuity()
    c.read("p", 0, 4)
    assert c.read("p", 8, 8) == 5
    c.moved("p", 5)  # what the consumer does with that answer
    assert c.read("p", 8, 8) is None  # the same gap again: a hole


def test_a_seek_elsewhere_clears_a_suspected_gap() -> None:
    c: Continuity[str] = Continuity()
    c.read("p", 0, 4)
    assert c.read("p", 8, 8) == 5
    c.moved("p", 2)  # a dropped batch read again from 2
    assert c.read("p", 2, 4) is None
    assert c.read("p", 8, 8) == 5  # suspected afresh, not accepted


def test_partitions_not_assigned_are_forgotten() -> None:
    c: Continuity[str] = Continuity()
    c.read("a", 0, 4)
    c.read("b", 0, 4)
    c.keep_only(["a"])
    assert c.expected("b") is None
    assert c.read("b", 100, 101) is None  # a new owner's position: no gap
    assert c.expected("a") == 5


@settings(max_examples=100, deadline=None)
@given(
    holes=st.sets(st.integers(0, 29), max_size=8),
    takes=st.lists(st.integers(1, 6), min_size=120, max_size=120),
    skips=st.lists(st.integers(0, 4), min_size=120, max_size=120),
)
def test_a_reader_sees_every_record_despite_transient_skips(
    holes: set[int], takes: list[int], skips: list[int]
) -> None:
    """A reader whose polls sometimes skip records (never twice in a row) still sees every
    record of the log, whatever holes the log has, by doing what the consumer does."""
    log = [o for o in range(30) if o not in holes]
    c: Continuity[str] = Continuity()
    c.moved("p", 0)  # where the partition's position starts (its committed offset)
    position, seen, skipped_last = 0, set(), False
    for take, skip in zip(takes, skips, strict=True):
        ahead = [o for o in log if o >= position]
        if not ahead:
            break
        if skip and not skipped_last and len(ahead) > skip:  # a buggy poll
            ahead = ahead[skip:]
            skipped_last = True
        else:
            skipped_last = False
        got = ahead[:take]
        position = got[-1] + 1  # the client moved on past what it returned
        again = c.read("p", got[0], got[-1])
        if again is None:
            seen.update(got)
        else:
            position = again
            c.moved("p", again)
    else:
        raise AssertionError(f"the reader did not reach the end: {sorted(seen)}")
    assert seen == set(log)


@pytest.mark.parametrize(
    ("batches", "holes", "answers"),
    [
        # whole batches: keep everything
        ([[0, 1, 2], [3, 4]], 0, [(3, None), (2, None)]),
        # a record missing inside a batch: keep what comes before it, read again from it;
        # it comes back
        ([[0, 1, 3, 4], [2, 3, 4]], 0, [(2, 2), (3, None)]),
        # a real hole inside (a transaction marker at 2): read again once, then accepted
        ([[0, 1, 3, 4], [3, 4], [5]], 0, [(2, 2), (2, None), (1, None)]),
        # the retry lane allows one missing offset between records (its markers)
        ([[0, 1, 3, 4, 6]], 1, [(5, None)]),
        ([[0, 1, 4, 5]], 1, [(2, 2)]),
        # a gap before the batch is read again first, whatever is inside
        ([[0, 1], [4, 6]], 0, [(2, None), (0, 2)]),
    ],
)
def test_read_batch(
    batches: list[list[int]], holes: int, answers: list[tuple[int, int | None]]
) -> None:
    c: Continuity[str] = Continuity()
    c.moved("p", 0)
    assert [c.read_batch("p", b, holes) for b in batches] == answers


def test_a_gap_inside_a_batch_that_comes_back_counts_as_recovered() -> None:
    c: Continuity[str] = Continuity()
    c.moved("p", 0)
    assert c.read_batch("p", [0, 1, 3]) == (2, 2)
    c.moved("p", 2)  # the consumer seeks there
    assert c.read_batch("p", [2, 3]) == (2, None)
    assert (c.reread, c.recovered) == (1, 1)


@settings(max_examples=300, deadline=None)
@given(
    holes=st.sets(st.integers(0, 29), max_size=6),
    takes=st.lists(st.integers(1, 6), min_size=120, max_size=120),
    drops=st.lists(st.integers(0, 5), min_size=120, max_size=120),
)
def test_a_reader_sees_every_record_though_a_poll_drops_one_inside_a_batch(
    holes: set[int], takes: list[int], drops: list[int]
) -> None:
    """A poll that sometimes leaves out one record in the middle of what it returns (never
    twice in a row): the reader still sees every record, whatever holes the log has."""
    log = [o for o in range(30) if o not in holes]
    c: Continuity[str] = Continuity()
    c.moved("p", 0)
    position, seen, dropped_last = 0, set(), False
    for take, drop in zip(takes, drops, strict=True):
        ahead = [o for o in log if o >= position]
        if not ahead:
            break
        got = ahead[:take]
        if 0 < drop < len(got) - 1 and not dropped_last:  # a buggy poll
            got = got[:drop] + got[drop + 1 :]
            dropped_last = True
        else:
            dropped_last = False
        position = got[-1] + 1  # the client moved on past what it returned
        keep, again = c.read_batch("p", got)
        seen.update(got[:keep])
        if again is not None:
            position = again
            c.moved("p", again)
    else:
        raise AssertionError(f"the reader did not reach the end: {sorted(seen)}")
    assert seen == set(log)
