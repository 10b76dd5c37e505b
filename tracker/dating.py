"""When a markers record was written at the latest, by the tracker's own clock: the first
time its partition's high watermark was seen past its offset. Pure: no I/O; ``now`` is the
tracker's monotonic clock.

A tracker that reads its markers seconds late must not take what a record says for news:
a consumer's claim to read a partition (:class:`tracker.readers.LiveReaders`), read 3 s
after it was written, says nothing of the last 3 s; its consumer may have been killed
meanwhile. Record timestamps cannot date it, as they come from the writers' clocks. The
high watermarks the tracker sees each round can: a record below one seen at ``t`` was
written by ``t``."""

from __future__ import annotations

from bisect import bisect_right


class WriteDates:
    """Per markers partition, the high watermarks seen within the last ``window_s``, each
    with when it was first seen. Older ones only leave a floor: what lies below it was
    written more than ``window_s`` ago."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        self.window_s = window_s
        self._marks: dict[int, tuple[list[int], list[float]]] = {}
        self._floor: dict[int, int] = {}

    def observe(self, partition: int, highwater: int, now: float) -> None:
        """``partition``'s high watermark, as known at ``now``."""
        marks, times = self._marks.setdefault(partition, ([], []))
        if highwater < (marks[-1] if marks else self._floor.get(partition, 0)):
            # The log was truncated or the topic recreated: nothing seen before holds.
            marks.clear()
            times.clear()
            self._floor.pop(partition, None)
        if not marks or highwater > marks[-1]:
            marks.append(highwater)
            times.append(now)
        cutoff = now - self.window_s
        old = bisect_right(times, cutoff)
        if old:
            self._floor[partition] = marks[old - 1]
            del marks[:old], times[:old]

    def latest(self, partition: int, offset: int, now: float) -> float | None:
        """By when the record at ``offset`` was written at the latest: ``now`` if no high
        watermark seen lately is past it; ``None`` if that was over ``window_s`` ago."""
        if offset < self._floor.get(partition, 0):
            return None
        seen = self._marks.get(partition)
        if seen is None:
            return now
        marks, times = seen
        first_past = bisect_right(marks, offset)
        return min(now, times[first_past]) if first_past < len(marks) else now
