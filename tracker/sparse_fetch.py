"""A re-read consumer that parses only the records it was asked for.

The tracker re-reads due records to copy them, and the records between them come along in
the same fetched batches: with one record in ten due, kafka-python parsed ten records (about
6.4 µs each on the bench machine) and built ten ConsumerRecords for every copy, and the
re-read took half of the tracker's time in the benchmark's 10 %-dropped run. :func:`install`
gives a consumer's fetcher :class:`kmq.unpack.Records` told which offsets are wanted: a batch
holding none of them is not read at all, within a batch the records not wanted are stepped
over by their length (:mod:`kmq.record_v2`), and the batches past the last offset wanted are
left unread (the position stops at the first of them).

Everything around the records stays kafka-python's: aborted-transaction filtering, control
batches, CRC checks of whole batches, positions (a batch read to its end moves the position
past the records skipped in it). Without kafka-python's hook (a stub) :func:`install` does
nothing: the re-read then parses every record, as before.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Mapping
from typing import Any

from kmq import unpack


def install(consumer: Any, wanted: Mapping[Any, Collection[int]]) -> bool:
    """Make ``consumer`` return, for a partition in ``wanted``, only the records at the
    offsets it lists (other partitions: all). ``wanted`` is read, never written, and read
    again whenever unpacking goes on: kafka-python keeps a partition's unpacked records
    across a re-assignment and hands them out if the new position matches, so records
    unpacked during one scan may be returned in the next, which wants other offsets. A
    partition's offsets are replaced, not changed in place (a frozenset, say). False: this
    consumer has no such hook (a stub)."""

    class SparseRecords(unpack.Records):
        def __init__(self, fetch_offset: int, tp: Any, records: Any, *args: Any, **kw: Any):
            self.wanted = _Wanted(wanted, tp)
            super().__init__(fetch_offset, tp, records, *args, **kw)

    return unpack.install(consumer, SparseRecords)


class _Wanted:
    """The offsets of one partition wanted now (``None``: every record)."""

    __slots__ = ("_frozen", "_last", "_sorted", "_tp", "_wanted")

    def __init__(self, wanted: Mapping[Any, Collection[int]], tp: Any) -> None:
        self._wanted = wanted
        self._tp = tp
        self._last: Collection[int] | None = None
        self._frozen: frozenset[int] = frozenset()
        self._sorted: list[int] = []

    def now(self) -> frozenset[int] | None:
        offsets = self._wanted.get(self._tp)
        if offsets is None:
            return None
        if offsets is not self._last:
            self._last = offsets
            self._frozen = frozenset(offsets)
            self._sorted = sorted(self._frozen)
        return self._frozen

    def last(self) -> int | None:
        """The highest offset wanted now (``None``: every one, or none)."""
        if self.now() is None or not self._sorted:
            return None
        return self._sorted[-1]

    def any_between(self, first: int, last: int) -> bool:
        """Whether an offset from ``first`` to ``last`` is wanted now (or every one is)."""
        if self.now() is None:
            return True
        i = bisect_left(self._sorted, first)
        return i < len(self._sorted) and self._sorted[i] <= last
