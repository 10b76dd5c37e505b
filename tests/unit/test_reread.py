"""Re-reading due records: which offsets one forward scan covers (tracker.reread.clusters)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.markers import QUEUE_LANE
from kmq.records import delivery_key, split_key
from tracker.reread import SCAN_GAP, RecordReader, clusters
from tracker.state import Due


@pytest.mark.parametrize(
    ("offsets", "gap", "expected"),
    [
        ([], 10, []),
        ([5], 10, [[5]]),
        ([5, 5, 5], 10, [[5]]),
        ([3, 1, 2], 10, [[1, 2, 3]]),
        ([0, 10], 10, [[0, 10]]),  # exactly the gap apart: one scan
        ([0, 11], 10, [[0], [11]]),
        ([0, 10, 20, 31, 41, 100], 10, [[0, 10, 20], [31, 41], [100]]),
        ([100, 0], 0, [[0], [100]]),
        ([7, 7, 8], 0, [[7], [8]]),
        ([0, SCAN_GAP], SCAN_GAP, [[0, SCAN_GAP]]),
    ],
)
def test_clusters(offsets: list[int], gap: int, expected: list[list[int]]) -> None:
    assert clusters(offsets, gap) == expected


def test_default_gap() -> None:
    assert SCAN_GAP == 5000
    assert clusters([0, 5000, 10_001]) == [[0, 5000], [10_001]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**6)), st.integers(0, 10**5))
def test_clusters_partition_the_sorted_offsets(offsets: list[int], gap: int) -> None:
    out = clusters(offsets, gap)
    assert [o for c in out for o in c] == sorted(set(offsets))
    for cluster in out:
        assert cluster
        assert all(b - a <= gap for a, b in itertools.pairwise(cluster))
    for before, after in itertools.pairwise(out):
        assert after[0] - before[-1] > gap


# -- RecordReader against a stub consumer ---------------------------------------------------


class _Rec:
    def __init__(self, partition: int, offset: int) -> None:
        self.partition, self.offset = partition, offset
        self.key, self.value, self.headers = b"q", f"v{offset}".encode(), [("kmq.id", b"x")]


class _StubReader:
    """A consumer over one partition: ``log`` holds the offsets that exist (read_committed
    view); ``polls`` scripts how many records each poll may return (0: the fetch has not
    come back yet). ``highwater`` is what the consumer last learnt, possibly stale;
    ``log_start`` models retention (a seek below it resets to it)."""

    def __init__(
        self,
        log: list[int],
        *,
        highwater: int | None,
        polls: list[int],
        log_start: int = 0,
        end: int | None = None,
        stale: bool = False,
    ) -> None:
        self.log, self._highwater, self.polls, self.log_start = log, highwater, polls, log_start
        self.end = end if end is not None else max(log, default=-1) + 1
        """The partition's true end (aborted records and control records count)."""
        self.stale = stale
        """The high watermark survives a new assignment (a fetch answered late)."""
        self._position = 0
        self.tp: Any = None
        self.assignments: list[list[Any]] = []
        self.record_reader: RecordReader | None = None
        self.paused = False

    def assign(self, partitions: list[Any]) -> None:
        self.assignments.append(list(partitions))
        self.paused = False
        if not partitions:
            if not self.stale:
                self._highwater = None  # a fresh partition state
            return
        self.tp = partitions[0]

    def seek(self, partition: Any, offset: int) -> None:
        self._position = max(offset, self.log_start)

    def pause(self, *partitions: Any) -> None:
        self.paused = True

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[_Rec]]:
        allowed = self.polls.pop(0) if self.polls else 10**9
        out = [o for o in self.log if o >= self._position][: min(allowed, max_records or 10**9)]
        if out:
            self._position = out[-1] + 1
        elif allowed:  # a fetch came back: skipped (aborted) offsets are passed, end learnt
            self._highwater = self.end
            self._position = max(self._position, self.end)
        return {self.tp: [_Rec(self.tp.partition, o) for o in out]} if out else {}

    def highwater(self, partition: Any) -> int | None:
        return self._highwater

    def position(self, partition: Any) -> int:
        return self._position


def _due(offset: int, partition: int = 1) -> Due:
    return Due(
        marker_partition=0,
        key=delivery_key(QUEUE_LANE, partition, offset),
        start_offset=0,
        attempt_step=1,
        reason="nacked",
        max_attempts=5,
        dead_letter_queue="",
    )


def _read(reader: _StubReader, offsets: list[int]) -> tuple[list[int], list[int], list[int]]:
    """One round: the same RecordReader for the same stub, as in the daemon."""
    if reader.record_reader is None:
        reader.record_reader = RecordReader(reader, {QUEUE_LANE: "q"}, scan_timeout_s=0.0)
    result = reader.record_reader.read([_due(o) for o in offsets])
    found = sorted(split_key(k)[2] for k in result.found)
    return found, sorted(split_key(d.key)[2] for d in result.gone), sorted(
        split_key(d.key)[2] for d in result.waiting
    )


def test_a_stale_high_watermark_never_makes_a_record_gone() -> None:
    # The chaos run that lost a message: the reader last fetched this partition when it
    # ended at 2800; the record at 2821 came later, and the first poll after the seek
    # returned nothing in time. The old reader called 2821 gone.
    for stale in (False, True):  # True: even if the old end outlives the new assignment
        reader = _StubReader(list(range(2700, 2830)), highwater=2800, polls=[0], stale=stale)
        assert _read(reader, [2821]) == ([], [], [2821])
        assert reader.assignments[:2] == [[], [reader.tp]]  # a partition state of its own
        # The next round's fetch comes back: found.
        assert _read(reader, [2821]) == ([2821], [], [])


def test_a_start_naming_a_record_past_the_end_is_gone_after_two_scans() -> None:
    reader = _StubReader([10, 11], highwater=None, polls=[])
    assert _read(reader, [500]) == ([], [], [500])
    assert _read(reader, [500]) == ([], [500], [])
    assert _read(reader, [500]) == ([], [], [500])  # counted once; a new round starts over


def test_read_past_is_gone_found_is_found() -> None:
    reader = _StubReader([10, 11, 13, 14], highwater=15, polls=[])  # 12: an aborted record
    assert _read(reader, [11, 12, 14]) == ([11, 14], [12], [])


def test_an_aborted_record_at_the_end_is_gone_once_the_position_passes_it() -> None:
    # 12 was an aborted record and the abort marker 13 ends the partition: the consumer's
    # position moves to 14 without returning anything.
    reader = _StubReader([10, 11], highwater=None, polls=[], end=14)
    assert _read(reader, [12]) == ([], [12], [])


def test_below_the_log_start_is_gone() -> None:
    reader = _StubReader([50, 51], highwater=52, polls=[], log_start=50)
    assert _read(reader, [7, 51]) == ([51], [7], [])


def test_not_reached_in_time_waits() -> None:
    reader = _StubReader(list(range(100)), highwater=100, polls=[5])
    assert _read(reader, [1, 90]) == ([1], [], [90])


class _Partitions:
    """A consumer over several partitions, each a :class:`_StubReader` with a script of
    its own; a poll returns what each returns (a paused one: nothing)."""

    def __init__(self, **by_partition: _StubReader) -> None:
        self.stubs = {int(p[1:]): stub for p, stub in by_partition.items()}
        self.assignments: list[list[int]] = []

    def assign(self, partitions: list[Any]) -> None:
        self.assignments.append(sorted(tp.partition for tp in partitions))
        for number, stub in self.stubs.items():
            stub.assign([tp for tp in partitions if tp.partition == number])

    def seek(self, partition: Any, offset: int) -> None:
        self.stubs[partition.partition].seek(partition, offset)

    def pause(self, *partitions: Any) -> None:
        for tp in partitions:
            self.stubs[tp.partition].pause(tp)

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[_Rec]]:
        out: dict[Any, list[_Rec]] = {}
        for stub in self.stubs.values():
            if stub.tp is not None and stub.assignments[-1] and not stub.paused:
                out.update(stub.poll(timeout_ms, max_records))
        return out

    def highwater(self, partition: Any) -> int | None:
        return self.stubs[partition.partition].highwater(partition)

    def position(self, partition: Any) -> int:
        return self.stubs[partition.partition].position(partition)


def _read_many(
    reader: _Partitions, wanted: list[tuple[int, int]]
) -> dict[int, tuple[list[int], list[int], list[int]]]:
    """One round over (partition, offset)s: per partition, (found, gone, waiting)."""
    result = RecordReader(reader, {QUEUE_LANE: "q"}, scan_timeout_s=0.0).read(
        [_due(offset, partition) for partition, offset in wanted]
    )
    out: dict[int, tuple[list[int], list[int], list[int]]] = {
        p: ([], [], []) for p in reader.stubs
    }
    for i, keys in enumerate((list(result.found), [d.key for d in result.gone],
                              [d.key for d in result.waiting])):  # fmt: skip
        for key in keys:
            _, partition, offset = split_key(key)
            out[partition][i].append(offset)
    return {p: (sorted(f), sorted(g), sorted(w)) for p, (f, g, w) in out.items()}


def test_partitions_are_scanned_together_each_to_its_own_outcome() -> None:
    reader = _Partitions(
        p1=_StubReader([10, 11, 13], highwater=14, polls=[]),  # 12: an aborted record
        p2=_StubReader(list(range(100)), highwater=100, polls=[0, 5]),  # slow to fetch
        p3=_StubReader([50, 51], highwater=52, polls=[], log_start=50),
    )
    assert _read_many(reader, [(1, 11), (1, 12), (2, 3), (3, 7), (3, 51)]) == {
        1: ([11], [12], []),
        2: ([], [], [3]),  # its fetch had not come back when the scan's time ran out
        3: ([51], [7], []),
    }
    assert reader.assignments == [[], [1, 2, 3]]  # one pass: every partition at once
    assert reader.stubs[1].paused and reader.stubs[3].paused  # done, while 2 went on


def test_a_partition_whose_offsets_lie_far_apart_takes_a_pass_per_cluster() -> None:
    far = SCAN_GAP + 100
    reader = _Partitions(
        p1=_StubReader([5, far], highwater=far + 1, polls=[]),
        p2=_StubReader([8], highwater=9, polls=[]),
    )
    found = _read_many(reader, [(1, 5), (1, far), (2, 8)])
    assert found == {1: ([5, far], [], []), 2: ([8], [], [])}
    assert reader.assignments == [[], [1, 2], [], [1]]
    assert reader.stubs[1].assignments[-1] == [reader.stubs[1].tp]
