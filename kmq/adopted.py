"""Retry-lane partitions a consumer reads for its queue while no other consumer does.

When every consumer that read a queue's retry lane is gone (killed together, say), the
tracker still writes the copies of what they held, to a retry partition nobody reads, and
says so on the control topic (an ``unread`` notice, :mod:`kmq.control`). The queue's new
consumers cannot be given that partition before their group settles, which waits for each
dead member's session to run out (and, on the embedded broker, a few seconds per join on
top). So a consumer that reads nothing of the queue's retry lane reads the noticed
partitions meanwhile: it *adopts* them.

Several such consumers may adopt the same partition: its copies are then delivered to each
of them (duplicates, never a loss). An adopted partition is given up once the consumer's
group has settled in a later generation than the one it was adopted in (the partition's
owner reads it then) and the consumer has read it to its end, or, should the group not
move, once its notice is gone and it has been read for ``hold_s``. Read to its end: in full
chaos run 73 a consumer adopted a partition as its first join was ending, gave it up 0.2 s
later, once the join had settled, before it had fetched the copies there, and no member
of the new generation read the partition for 20 s. Nothing is held past ``hold_s`` for
want of reaching the end (a partition whose last records belong to a transaction never
ended, say). Pure: no I/O, time passed in.
"""

from __future__ import annotations

from collections.abc import Set

READOPT_AFTER_S = 5.0
"""A partition given up is not adopted again for this long: time enough for its notice to be
withdrawn once its owner is heard (a tracker round, then the control topic's tail), so the
consumer does not read it beside its owner."""


class Adopted:
    """The retry partitions one consumer has adopted, and when."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._since: dict[int, tuple[int, float]] = {}
        """Partition -> (the member's generation, the time) at adoption."""
        self._gave_up: dict[int, float] = {}

    @property
    def partitions(self) -> frozenset[int]:
        return frozenset(self._since)

    def update(
        self,
        noticed: Set[int],
        reading: Set[int],
        generation: int,
        settled: bool,
        now: float,
        *,
        read_through: Set[int],
    ) -> tuple[frozenset[int], frozenset[int]]:
        """(adopted now, given up now). ``noticed``: the queue's ``unread`` notices;
        ``reading``: what the consumer reads of the queue's retry lane besides (those that
        go with its queue partitions, its spares); ``generation`` and ``settled``: its
        group membership (kafka-python's generation id, -1 before the first join; whether
        the member is STABLE); ``read_through``: the adopted partitions it has read up to
        their high watermark as last fetched."""
        hold_s = self.hold_s
        gone = frozenset(
            p
            for p, (at_generation, at) in self._since.items()
            if settled
            and (
                (generation > at_generation and (p in read_through or now - at >= hold_s))
                or (p not in noticed and now - at >= hold_s)
            )
        )
        for partition in gone:
            del self._since[partition]
            self._gave_up[partition] = now
        self._gave_up = {p: t for p, t in self._gave_up.items() if now - t < READOPT_AFTER_S}
        new: frozenset[int] = frozenset()
        if not reading:
            new = frozenset(noticed) - self._since.keys() - self._gave_up.keys()
        for partition in new:
            self._since[partition] = (generation, now)
        return new, gone
