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

Read only in a replay, ticks say nothing about the time between the predecessor's last tick
and the replay (its session running out, a group join): that much of every lease still
starts over. A *beacon* covers it where the successor was running before: every replica
writes one to every markers partition each second, and the owner of each reads it at once,
so ``read time - sent`` bounds the offset between the two clocks closely
(:class:`ClockBounds`); a tick names its writer's clock, and the successor uses the closer
bound.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping

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


def tick_text(sent_ms: int, acked: tuple[int, float] | None, clock: int | None = None) -> bytes:
    """The text of a PROBE sent at ``sent_ms`` that makes it a tick: ``acked`` is an earlier
    PROBE's ``(offset, acknowledged at)`` on the sender's monotonic clock (in seconds);
    ``clock`` names that clock, as the sender's beacons do."""
    if acked is None:
        return b""
    offset, at = acked
    age_ms = sent_ms - ceil_ms(at)
    if offset < 0 or not 0 <= age_ms <= MAX_AGE_MS:
        return b""  # acknowledged in the same millisecond: nothing gained, nothing claimed
    if clock is None:
        return b"%d %d" % (offset, age_ms)
    return b"%d %d %d" % (offset, age_ms, clock)


def parse_tick(sent_ms: int, text: bytes) -> tuple[int, int, int | None] | None:
    """``(acked_offset, acked_at_ms, clock)`` from a PROBE's text (``clock`` is ``None`` in
    a tick of a tracker before beacons); ``None`` for a plain PROBE or a text this version
    does not understand."""
    if not text:
        return None
    parts = text.split(b" ")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        return None
    offset, age_ms = int(parts[0]), int(parts[1])
    if age_ms > MAX_AGE_MS or age_ms > sent_ms:
        return None
    return offset, sent_ms - age_ms, int(parts[2]) if len(parts) == 3 else None


BEACON_S = 1.0
"""How often a replica writes a beacon to every markers partition."""

CLOCK_WINDOW_S = 60.0
"""How long one beacon's bound is used. Two monotonic clocks drift apart by at most a few
hundred parts in a million (NTP slews them within 500), so a bound this old is off by at
most 30 ms: within :data:`DRIFT_MARGIN_S`."""

HANDOVER_WAIT_S = 3 * BEACON_S
"""How long after its replay a successor still brings deadlines forward as beacons come:
one that joined while its predecessor was already gone learns that clock only through a
third replica's beacon, read live after its replay."""

_BEACON = b"clock "


def beacon_text(
    clock: int,
    known: Mapping[int, float] | None = None,
    sent_ms: int = 0,
    acked: tuple[int, float] | None = None,
) -> bytes:
    """The text of a beacon of ``clock`` (a PROBE of no tracker's, nonce 0, sent at
    ``sent_ms`` on that clock), passing on the writer's ``known`` bounds (seconds) on other
    clocks, each rounded up to a whole millisecond. With ``acked``, it is also a tick of
    that clock (:func:`tick_text`): the writer's last record in the partition it goes to,
    and when the broker acknowledged it."""
    parts = [b"%d" % clock]
    tick = tick_text(sent_ms, acked)
    if tick:
        parts.append(tick.replace(b" ", b"@"))
    parts.extend(b"%d:%d" % (c, ceil_ms(b)) for c, b in (known or {}).items())
    return _BEACON + b" ".join(parts)


def parse_beacon(
    sent_ms: int, text: bytes
) -> tuple[int, dict[int, int], tuple[int, int] | None] | None:
    """``(clock, {other clock: bound in ms}, tick)`` from the text of a beacon sent at
    ``sent_ms``; ``tick`` is ``(acked_offset, acked_at_ms)`` or ``None``. ``None`` if it is
    not a beacon."""
    if not text.startswith(_BEACON):
        return None
    parts = text[len(_BEACON) :].split(b" ")
    if not _is_clock(parts[0]):
        return None
    known: dict[int, int] = {}
    tick: tuple[int, int] | None = None
    for part in parts[1:]:
        if b"@" in part:
            parsed = parse_tick(sent_ms, part.replace(b"@", b" "))
            if parsed is None or parsed[2] is not None or tick is not None:
                return None
            tick = parsed[0], parsed[1]
            continue
        other, sep, bound = part.partition(b":")
        digits = bound[1:] if bound.startswith(b"-") else bound
        if not sep or not _is_clock(other) or not digits.isdigit() or len(digits) > 12:
            return None
        known[int(other)] = int(bound)
    return int(parts[0]), known, tick


def _is_clock(text: bytes) -> bool:
    return text.isdigit() and len(text) <= 10


class ClockBounds:
    """How far other replicas' monotonic clocks may be behind this one's, from their beacons
    (pure; no I/O).

    A beacon sent at ``sent`` on its writer's clock and read at ``now`` on this one was read
    after it was sent, so ``now - sent`` is at least the offset between the two clocks: a
    time ``t`` on the writer's clock is at most ``t + bound`` here. Beacons read promptly
    make it close; the least of those read within :data:`CLOCK_WINDOW_S` is kept. A beacon
    also passes on its writer's own such bounds on other clocks: added to the bound on the
    writer, each is one on that clock (which may be gone before this replica ever read a
    beacon of it). Only bounds from beacons read here are passed on, so none is older than
    two windows.
    """

    def __init__(self, own: int) -> None:
        self.own = own
        self._direct: dict[int, tuple[float, float]] = {}  # clock: (bound_s, observed at)
        self._through: dict[int, tuple[float, float]] = {}  # the same, via another replica
        self.version = 0
        """Goes up whenever a bound is new or closer."""

    def observe(
        self, clock: int, sent_ms: int, now: float, known: Mapping[int, int] | None = None
    ) -> None:
        """A beacon of ``clock`` sent at ``sent_ms`` (its clock) was read at ``now``;
        ``known``: the bounds (ms) it passed on."""
        if clock == self.own:
            return
        direct = now - sent_ms / 1000
        self._keep(self._direct, clock, direct, now)
        for other, bound_ms in (known or {}).items():
            if other != self.own:
                self._keep(self._through, other, direct + bound_ms / 1000, now)

    def _keep(self, table: dict[int, tuple[float, float]], clock: int, bound: float,
              now: float) -> None:  # fmt: skip
        known = table.get(clock)
        if known is None or now - known[1] > CLOCK_WINDOW_S or bound < known[0]:
            table[clock] = (bound, now)
            self.version += 1
        elif bound == known[0]:
            table[clock] = (bound, now)  # as close, and newer

    def bound(self, clock: int, now: float) -> float | None:
        """The offset bound for ``clock`` (0 for this replica's own); ``None`` if no beacon
        told of it within :data:`CLOCK_WINDOW_S`."""
        if clock == self.own:
            return 0.0
        best: float | None = None
        for table in (self._direct, self._through):
            known = table.get(clock)
            if known is not None and now - known[1] <= CLOCK_WINDOW_S:
                best = known[0] if best is None else min(best, known[0])
        return best

    def passed_on(self, now: float) -> dict[int, float]:
        """What this replica's beacons pass on: its bounds from beacons it read itself."""
        return {c: b for c, (b, at) in self._direct.items() if now - at <= CLOCK_WINDOW_S}

    def forget_stale(self, now: float) -> None:
        """Drop the bounds too old to use (replicas long gone)."""
        for table in (self._direct, self._through):
            for clock in [c for c, (_, at) in table.items() if now - at > CLOCK_WINDOW_S]:
                del table[clock]


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
        """A tick of ``owner`` (the clock it names, else its writer's nonce) read at
        ``now``: the marker at ``acked_offset`` was on the broker by ``acked_at_ms`` on the
        owner's clock."""
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

    def deadlines(
        self, clocks: ClockBounds | None = None, now: float = 0.0
    ) -> Iterator[tuple[int, float]]:
        """``(key, deadline)`` for every lease a tick covers, on the reader's clock; with
        ``clocks``, by the closer of the ticks' and the beacons' bounds at ``now``."""
        marks, offsets = self._marks, dict(self._clock_offset_s)
        if clocks is not None:
            for owner, offset_s in offsets.items():
                beacon = clocks.bound(owner, now)
                if beacon is not None and beacon < offset_s:
                    offsets[owner] = beacon
        for key, (owner, acked_at_s, lease_s, offset) in self._bounds.items():
            if marks.get(key) == offset:
                yield key, acked_at_s + offsets[owner] + lease_s + DRIFT_MARGIN_S
