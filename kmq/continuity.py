"""Noticing records a poll skipped: the consumer's check that it reads each partition whole.

A message no consumer ever STARTs is lost for good once a later offset of its partition is
committed. The consumer commits only what it has polled, so a poll that silently skips a
record (a client or broker bug, a position moved under the consumer) loses it. Kafka
itself allows gaps only where the log has no record to return: transaction markers,
aborted transactions, compaction, retention. Both kinds look alike from a poll, so a gap
is read again once: a skipped record then comes back; a real hole comes back the same and
is accepted.

Pure: the consumer adapter (:mod:`kmq.consumer`) feeds it what polls returned and where it
sought, and seeks where it says. Tested in ``tests/unit/test_continuity.py``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


class Continuity(Generic[P]):
    """Per partition, the offset the next polled record should have."""

    def __init__(self) -> None:
        self._next: dict[P, int] = {}
        self._suspect: dict[P, tuple[int, int]] = {}
        self.reread = 0
        """Gaps read again."""
        self.recovered = 0
        """Gaps whose reading again returned records a poll had skipped."""

    def expected(self, partition: P) -> int | None:
        return self._next.get(partition)

    def moved(self, partition: P, offset: int) -> None:
        """The consumer sought ``partition`` to ``offset`` (to read a gap again, say)."""
        self._next[partition] = offset
        suspect = self._suspect.get(partition)
        if suspect is not None and suspect[0] != offset:
            del self._suspect[partition]

    def keep_only(self, partitions: Iterable[P]) -> None:
        """Forget partitions no longer assigned: a new owner's position starts elsewhere."""
        keep = set(partitions)
        for partition in [p for p in self._next if p not in keep]:
            del self._next[partition]
            self._suspect.pop(partition, None)

    def read(self, partition: P, first: int, last: int, holes: int = 0) -> int | None:
        """A poll returned ``partition``'s records ``first``..``last``. Returns the offset
        to read it again from if records before ``first`` may have been skipped (the
        caller then drops these records and seeks there), else ``None``. A gap of at most
        ``holes`` offsets is taken for what it most likely is without reading it again:
        a transactional topic has one transaction marker after each transaction."""
        expected = self._next.get(partition)
        suspect = self._suspect.get(partition)
        if suspect is not None and suspect[0] != expected:
            suspect = None
        # Read again at a first sight of a gap, or when a read skipped even more than the
        # last one (the smaller gap is kept: records from its end exist). Two reads that
        # found nothing from `expected` up to `first` mean the log has no record there.
        if (
            expected is not None
            and first > expected + holes
            and (suspect is None or first > suspect[1])
        ):
            if suspect is None:
                self._suspect[partition] = (expected, first)
            self.reread += 1
            return expected
        if suspect is not None:
            del self._suspect[partition]
            if first < suspect[1]:
                self.recovered += 1
        self._next[partition] = last + 1
        return None

    def read_batch(
        self, partition: P, offsets: Sequence[int], holes: int = 0
    ) -> tuple[int, int | None]:
        """A poll returned ``partition``'s records at ``offsets`` (ascending). Returns how
        many of them to keep, from the first, and where to read again from (``None``: keep
        all). A gap inside the batch is taken like one between polls: the records before it
        are kept and the rest read again from where it starts. (Most likely how a full
        chaos run lost a record: two producers' requests, let go together by a network
        stall, got consecutive offsets, and a poll returned the later record without the
        earlier one.)"""
        first, last = offsets[0], offsets[-1]
        if last - first + 1 == len(offsets) or last - first + 1 <= len(offsets) + holes:
            again = self.read(partition, first, last, holes)
            return (0, again) if again is not None else (len(offsets), None)
        cut = next(
            (i for i in range(1, len(offsets)) if offsets[i] > offsets[i - 1] + 1 + holes),
            None,
        )
        again = self.read(partition, first, offsets[-1 if cut is None else cut - 1], holes)
        if again is not None:
            return 0, again
        if cut is None:
            return len(offsets), None
        start = offsets[cut - 1] + 1
        self._suspect[partition] = (start, offsets[cut])
        self.reread += 1
        return cut, start
