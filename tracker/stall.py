"""Whether reading a markers partition has stopped short of its end (pure).

The tracker reads markers ``read_committed``: nothing past a partition's last stable
offset reaches it while a transaction that wrote there before is still open. Apache Kafka
ends every transaction within its transaction timeout (60 s by default), by the producer
or by its coordinator. A partition whose reading stands still below its high watermark for
longer is held by a transaction nobody will end (a "hanging transaction", or a broker that
lost track of one): no START, END or tick past it is read, so nothing written there after
it is ever redelivered. That must be loud, never silent.
"""

from __future__ import annotations

from enum import Enum


class Change(Enum):
    STALLED = "stalled"
    RESUMED = "resumed"


class Stall:
    """One partition's reading progress. Feed :meth:`observe` the reader's position and the
    partition's high watermark each round; it says when the partition has been stuck for
    ``after_s`` and when it moves again."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._position: int | None = None
        self._since: float | None = None
        """When the position last moved, or the partition was last fully read."""
        self._behind = False
        self.stalled = False

    def observe(self, position: int | None, highwater: int | None, now: float) -> Change | None:
        """The round's position and high watermark (``None``: not known yet)."""
        behind = position is not None and highwater is not None and position < highwater
        self._behind = behind
        if position != self._position or not behind or self._since is None:
            self._position = position
            self._since = now
            if self.stalled:
                self.stalled = False
                return Change.RESUMED
            return None
        if not self.stalled and now - self._since >= self.after_s:
            self.stalled = True
            return Change.STALLED
        return None

    def behind_for(self, now: float) -> float:
        """Seconds the position has stood still short of the high watermark as of the last
        :meth:`observe`, stalled or not yet; 0 when it moved or was at the end."""
        if not self._behind or self._since is None:
            return 0.0
        return max(0.0, now - self._since)

    def stalled_for(self, now: float) -> float:
        """Seconds the partition has stood still short of its end; 0 unless stalled."""
        if not self.stalled or self._since is None:
            return 0.0
        return max(0.0, now - self._since)
