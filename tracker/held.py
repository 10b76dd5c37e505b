"""Notice a markers partition whose reader is held below the high watermark, and say when
to nudge it: a transaction, of a producer of the replica's own, writing its PROBE to it.

Why: on the embedded broker (Tansu 0.6) a transaction whose end arrives while another
transaction that wrote to one of the same partitions is still open is only *prepared*. A
later transaction end that overlaps it completes it, but only when nothing that overlaps
that end is open; when no such end comes, nothing completes it (that broker has no
transaction timeout). Its records stay hidden from ``read_committed``
readers, and so does everything written after them to its partitions: the tracker's markers
reader stops below the high watermark, no PROBE comes back, nothing is redelivered from the
partition, so no transaction of its producer comes to end the first. Redeliveries from
every markers partition write copies to the same retry partitions, so the two trackers'
transactions overlap all the time; full chaos runs stalled for up to 17 s this way
(measured with the fetch responses: position fixed, high watermark growing, no bytes).
A transaction end completes every prepared transaction that overlaps it, when none that
overlaps it is open; so a transaction of another producer writing only to the held
partition (where no other transaction is open) completes the held one. It must be another
producer than the partition's own: that broker keeps one transaction per producer epoch, and
a new transaction of the same producer takes the held one's partitions up again, so its end
waits on the same open transactions (a nudge by the partition's own producer made a full
chaos run's stalls longer: 70 stretches, 550 s, against 17, 85 s without). On Apache Kafka
a transaction is completed by its own end, and a nudge is one small transaction more.
Pure: no I/O.
"""

from __future__ import annotations

NUDGE_AFTER_S = 1.0
"""How long a markers partition's reader may stay below a growing high watermark before
it is nudged, and how long between two nudges of one partition."""


class HeldWatch:
    """Per markers partition: where its reader was, since when, and the high watermark then."""

    def __init__(self, after_s: float = NUDGE_AFTER_S) -> None:
        if after_s <= 0:
            raise ValueError(f"after_s must be positive, got {after_s!r}")
        self._after_s = after_s
        self._seen: dict[int, tuple[int, int, float]] = {}  # position, highwater, since
        self._nudged: dict[int, float] = {}

    def observe(self, partition: int, position: int, highwater: int | None, now: float) -> bool:
        """Note the reader's ``position`` and the last ``highwater`` a fetch reported; True
        when the partition should be nudged now: the reader has not moved for ``after_s``
        while the high watermark grew past it (so fetches are answered, and withhold
        records), and it was not nudged in the last ``after_s``."""
        seen = self._seen.get(partition)
        if (
            seen is None
            or seen[0] != position
            or highwater is None
            or highwater <= position
            or highwater < seen[1]  # a new reader's first answer: start again
        ):
            self._seen[partition] = (position, highwater or 0, now)
            return False
        _, highwater_then, since = seen
        if highwater <= highwater_then or now - since < self._after_s:
            return False
        last = self._nudged.get(partition)
        return last is None or now - last >= self._after_s

    def nudged(self, partition: int, now: float) -> None:
        """A nudge of ``partition`` was written (or tried) at ``now``."""
        self._nudged[partition] = now

    def forget(self, partition: int) -> None:
        """The partition is no longer this replica's."""
        self._seen.pop(partition, None)
        self._nudged.pop(partition, None)
