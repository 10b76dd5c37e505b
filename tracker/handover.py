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
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Mapping

DRIFT_MARGIN_S = 0.1
"""Added to every deadline taken over: two monotonic clocks drift apart by a few parts in a
million, a few milliseconds over the longest lease."""

MAX_AGE_MS = 2**32 - 1

MAX_TRACKED = 100_000
"""Deliveries a replay keeps bookkeeping for (about 200 bytes each while the replay lasts,
so at most about 20 MB): a successor replaying a million open leases would otherwise hold
that much more than the leases themselves. One beyond it keeps the lease from its replay,
as without ticks."""

MAX_TICKS = 100_000
"""Ticks a replay keeps per writer (16 bytes each): four a second cover about seven hours
of one owner's markers. Those beyond cover nothing, as if never written."""


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

    Every tick after a marker bounds when that marker was on the broker, each on its
    writer's clock; the earliest bound wins, over every writer. A predecessor this replica
    never heard live writes the most ticks, but its clock is known only from them (read in
    the replay, long after they were sent); the ticks of a replica whose clock is known
    (this one's own beacons, written to every markers partition, or a live one's) bound
    the same markers closely.
    """

    def __init__(self) -> None:
        # Per delivery: (offset, lease_s) of the marker whose read time set its deadline.
        self._marks: dict[int, tuple[int, float]] = {}
        # Per writer (its clock, else its nonce): the offsets its ticks say were on the
        # broker, ascending, and when (seconds on its clock).
        self._ticks: dict[int, tuple[array[int], array[float]]] = {}
        # Per writer: the least (read time - acked_at) seen.
        self._clock_offset_s: dict[int, float] = {}

    def leased(self, offset: int, key: int, lease_s: float) -> None:
        """The marker at ``offset`` (a START or KEEPALIVE) set ``key``'s deadline to its read
        time plus ``lease_s``."""
        marks = self._marks
        if key not in marks and len(marks) >= MAX_TRACKED:
            return  # this one keeps its replay lease
        marks[key] = (offset, lease_s)

    def marked(self) -> list[int]:
        """The deliveries whose deadline a replayed lease set and that are not forgotten."""
        return list(self._marks)

    def forget(self, key: int) -> None:
        """``key``'s deadline was set some other way (a NACK, a second START), or it was
        settled: leave it."""
        self._marks.pop(key, None)

    def tick(self, owner: int, acked_offset: int, acked_at_ms: int, now: float) -> None:
        """A tick of ``owner`` (the clock it names, else its writer's nonce) read at
        ``now``: the marker at ``acked_offset`` was on the broker by ``acked_at_ms`` on the
        owner's clock."""
        acked_at_s = acked_at_ms / 1000
        offset_s = now - acked_at_s
        known = self._clock_offset_s.get(owner)
        if known is None or offset_s < known:
            self._clock_offset_s[owner] = offset_s
        ticks = self._ticks.get(owner)
        if ticks is None:
            ticks = self._ticks[owner] = (array("q"), array("d"))
        offsets, times = ticks
        # One no further than the last covers no marker the last does not, and no sooner.
        if (not offsets or acked_offset > offsets[-1]) and len(offsets) < MAX_TICKS:
            offsets.append(acked_offset)
            times.append(acked_at_s)

    def deadlines(
        self, clocks: ClockBounds | None = None, now: float = 0.0
    ) -> Iterator[tuple[int, float]]:
        """``(key, deadline)`` for every lease a tick covers, on the reader's clock: the
        earliest over every writer's first tick after its marker, each by the closer of
        that writer's ticks' and (with ``clocks``) its beacons' bounds at ``now``."""
        writers: list[tuple[float, array[int], array[float]]] = []
        for owner, (offsets, times) in self._ticks.items():
            offset_s = self._clock_offset_s[owner]
            if clocks is not None:
                beacon = clocks.bound(owner, now)
                if beacon is not None and beacon < offset_s:
                    offset_s = beacon
            if offsets:
                writers.append((offset_s, offsets, times))
        if not writers:
            return
        for key, (offset, lease_s) in self._marks.items():
            best: float | None = None
            for offset_s, offsets, times in writers:
                i = bisect_right(offsets, offset)  # its first tick past the marker
                if i < len(offsets):
                    at = times[i] + offset_s
                    if best is None or at < best:
                        best = at
            if best is not None:
                yield key, best + lease_s + DRIFT_MARGIN_S
