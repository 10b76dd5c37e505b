"""Which retry-lane partitions of each queue a live consumer reads: what the ``kmq.reads``
headers of the marker records read lately say (:mod:`kmq.reads`). Pure: no I/O; ``now`` is
the tracker's monotonic clock."""

from __future__ import annotations

from collections.abc import Iterable

from kmq.reads import READS_HEADER, decode_reads

FRESH_S = 1.0
"""A partition counts as read while a consumer has said so within this long: one killed
drops out this long after its last marker record, sooner than its holder's lease runs out
(a third of a lease after its last keep-alive at best). A busy consumer writes records many
times a second, and every consumer reading the retry lane (its owned partitions' retry
partitions, a spare: :func:`kmq.layout.spare_candidates`, or an adopted one) says so every
0.4 s on each markers partition it wrote nothing to, even when it holds nothing. Nobody
heard from means nobody reads, or the tracker itself hears nothing: then copies go where
they went before (:func:`kmq.layout.away_from_holder`)."""
LATELY_S = 0.6
"""Partitions said within this long go first: a spare's reader says so every 0.4 s, so one
still counted only by :data:`FRESH_S` was most likely read by a consumer killed up to a
second ago (in a full chaos run, a killed owner's partition took a queue's copies while an
idle member read a spare of the queue; they waited 22 s for the group to rebalance)."""
BUSY_S = 0.25
"""Partitions said within this long go before those said only within :data:`LATELY_S`: a
consumer with messages in flight writes a marker record to each markers partition several
times a second (STARTs each poll, acks within ``poll_timeout_ms``, keep-alives), so one
silent for longer was most likely killed, or is idle. In full chaos runs 79, 80 and 81,
5, 39 and 7 copies waited 3 s or more to be taken that had been written 0.25 to 3 s after
a worker's kill while two or more of their queue's readers were heard: most likely sent to
the killed worker's partition, still counted as said lately. When nobody was heard this
recently (the tracker reading late, every reader idle), :data:`LATELY_S` decides as before."""
_MAX_CACHED = 4096


class LiveReaders:
    def __init__(self, fresh_s: float = FRESH_S) -> None:
        self.fresh_s = fresh_s
        self._seen: dict[str, dict[int, float]] = {}  # queue -> partition -> last said
        self._decoded: dict[bytes, tuple[str, frozenset[int]] | None] = {}

    def note(self, headers: Iterable[tuple[str, bytes | None]], at: float) -> None:
        """A marker record's headers, written by ``at`` at the latest
        (:class:`tracker.dating.WriteDates`): a claim read late does not count as newer
        than one read before it."""
        for key, value in headers:
            if key != READS_HEADER or value is None:
                continue
            if value in self._decoded:
                reads = self._decoded[value]
            else:
                if len(self._decoded) >= _MAX_CACHED:
                    self._decoded.clear()
                reads = self._decoded[value] = decode_reads(value)
            if reads is None:
                continue
            queue, partitions = reads
            seen = self._seen.get(queue)
            if seen is None:
                seen = self._seen[queue] = {}
            for partition in partitions:
                if seen.get(partition, at) <= at:
                    seen[partition] = at

    def live(self, queue: str, now: float, within_s: float | None = None) -> frozenset[int]:
        """The partitions of ``queue`` some consumer said it reads within ``fresh_s`` (or
        within ``within_s``, if shorter)."""
        seen = self._seen.get(queue)
        if not seen:
            return frozenset()
        cutoff = now - self.fresh_s
        for partition in [p for p, at in seen.items() if at < cutoff]:
            del seen[partition]
        if within_s is not None and within_s < self.fresh_s:
            lately = now - within_s
            return frozenset(p for p, at in seen.items() if at >= lately)
        return frozenset(seen)
