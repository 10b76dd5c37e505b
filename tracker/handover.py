"""Leases a successor takes over from its predecessor's ticks, instead of starting afresh
every lease it replays.

A tracker reads no client clock, so a lease runs from when the tracker *reads* its
marker. A successor replays a partition seconds (the predecessor's session, a group join)
after its markers were written, and so used to give every open lease a full new term.

A tick is the owner's PROBE with one more fact in its text: an earlier PROBE of the same
owner at ``acked_offset`` was acknowledged by the broker when the owner's monotonic clock
read ``acked_at_ms``. Every marker below ``acked_offset`` was on the broker by then, so its
lease (which the consumer started before writing it) ends by ``acked_at + lease``, on the
owner's clock. The successor needs no clock of another process to use that: a tick is read
after it was sent, which was after that acknowledgement, so for every tick of one owner
``read time - acked_at`` bounds the offset between the two clocks from above, and the
smallest such bound is the tightest. Reading late only makes the bound later: a lease is
never cut short, only no longer started over.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

DRIFT_MARGIN_S = 0.1
"""Added to every deadline taken over: two monotonic clocks drift apart by a few parts in a
million, a few milliseconds over the longest lease."""

MAX_AGE_MS = 2**32 - 1

MAX_PENDING = 100_000
"""Leases awaiting a tick are kept up to this many: a replay whose predecessor wrote no
ticks (ticks off, or a tracker before them) must not grow without bound. The oldest beyond
it keep the lease from their replay, as without ticks."""

MAX_TRACKED = 100_000
"""Deliveries a replay keeps bookkeeping for, awaiting a tick or covered by one (about 250
bytes each while the replay lasts, so at most about 25 MB): a successor replaying a
million open leases would otherwise hold that much more than the leases themselves. One
beyond it keeps the lease from its replay, as without ticks."""


def ceil_ms(t: float) -> int:
    """``t`` seconds in whole milliseconds, rounded up: ``ceil_ms(t) / 1000 >= t``."""
    ms = math.ceil(t * 1000)
    while ms / 1000 < t:
        ms += 1
    return ms


def tick_text(sent_ms: int, acked: tuple[int, float] | None) -> bytes:
    """The text of a PROBE sent at ``sent_ms`` that makes it a tick: ``acked`` is an earlier
    PROBE's ``(offset, acknowledged at)`` on the sender's monotonic clock (in seconds)."""
    if acked is None:
        return b""
    offset, at = acked
    age_ms = sent_ms - ceil_ms(at)
    if offset < 0 or not 0 <= age_ms <= MAX_AGE_MS:
        return b""  # acknowledged in the same millisecond: nothing gained, nothing claimed
    return b"%d %d" % (offset, age_ms)


def parse_tick(sent_ms: int, text: bytes) -> tuple[int, int] | None:
    """``(acked_offset, acked_at_ms)`` from a PROBE's text; ``None`` for a plain PROBE or
    a text this version does not understand."""
    if not text:
        return None
    parts = text.split(b" ")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    offset, age_ms = int(parts[0]), int(parts[1])
    if age_ms > MAX_AGE_MS or age_ms > sent_ms:
        return None
    return offset, sent_ms - age_ms


class Handover:
    """What one partition's replay learns from its predecessors' ticks (pure; no I/O).

    Tell it every lease a replayed marker starts or renews (:meth:`leased`), every change to
    a delivery's deadline that is not such a lease (:meth:`forget`), and every tick read
    (:meth:`tick`); once the replay is over, :meth:`deadlines` says which deadlines may be
    brought forward, and to when.
    """

    def __init__(self) -> None:
        # Leases read since the last tick that covers them, in offset order.
        self._pending: deque[tuple[int, int, float]] = deque()  # (offset, key, lease_s)
        # Per delivery, the offset of the marker whose read time set its deadline.
        self._marks: dict[int, int] = {}
        # Per delivery: (owner, acked_at_s, lease_s, marker offset) of the tick covering it.
        self._bounds: dict[int, tuple[int, float, float, int]] = {}
        # Per owner (its nonce): the least (read time - acked_at) seen.
        self._clock_offset_s: dict[int, float] = {}

    def leased(self, offset: int, key: int, lease_s: float) -> None:
        """The marker at ``offset`` (a START or KEEPALIVE) set ``key``'s deadline to its read
        time plus ``lease_s``."""
        pending, marks = self._pending, self._marks
        if len(pending) >= MAX_PENDING:
            self._evict_oldest()
        if key not in marks:
            while len(marks) >= MAX_TRACKED and pending:
                self._evict_oldest()
            if len(marks) >= MAX_TRACKED:
                return  # every tracked lease is covered: this one keeps its replay lease
        marks[key] = offset
        pending.append((offset, key, lease_s))

    def _evict_oldest(self) -> None:
        offset, key, _ = self._pending.popleft()
        if self._marks.get(key) == offset:
            del self._marks[key]
            self._bounds.pop(key, None)  # an earlier lease's bound, no longer its deadline

    def forget(self, key: int) -> None:
        """``key``'s deadline was set some other way (a NACK, a second START), or it was
        settled: leave it."""
        self._marks.pop(key, None)
        self._bounds.pop(key, None)

    def tick(self, owner: int, acked_offset: int, acked_at_ms: int, now: float) -> None:
        """A tick of ``owner`` read at ``now``: the marker at ``acked_offset`` was on the
        broker by ``acked_at_ms`` on the owner's clock."""
        acked_at_s = acked_at_ms / 1000
        offset_s = now - acked_at_s
        known = self._clock_offset_s.get(owner)
        if known is None or offset_s < known:
            self._clock_offset_s[owner] = offset_s
        pending, marks = self._pending, self._marks
        while pending and pending[0][0] < acked_offset:
            offset, key, lease_s = pending.popleft()
            if marks.get(key) == offset:
                self._bounds[key] = (owner, acked_at_s, lease_s, offset)

    def deadlines(self) -> Iterator[tuple[int, float]]:
        """``(key, deadline)`` for every lease a tick covers, on the reader's clock."""
        marks, offsets = self._marks, self._clock_offset_s
        for key, (owner, acked_at_s, lease_s, offset) in self._bounds.items():
            if marks.get(key) == offset:
                yield key, acked_at_s + offsets[owner] + lease_s + DRIFT_MARGIN_S
