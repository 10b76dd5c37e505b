"""Markers partitions whose owner has fallen silent, found from beacons, so that a live
replica can take them over before the consumer group does (pure; no I/O).

A replica killed outright leaves its partitions unserved until the group notices: its
session runs out, then the group rebalances (about 7 s on the embedded broker with a 3 s
session, and the session is 10 s by default, 45 s in Kafka's own default). Meanwhile every
lease on those partitions that ends goes unredelivered.

Every replica already writes a beacon to every markers partition each second
(:mod:`tracker.handover`). Next to it, in the same record, goes an *owns* entry naming the
partitions the writer holds. The owner of each partition reads them all, so it knows which
replica holds which partition and when it last heard from it. A partition is an orphan
once the replica that named it last is another one, and neither it nor any other has
named the partition for :attr:`OwnerWatch.silence_s`, judged against this replica's own
beacons read back (only those say how far it has read: a replica that is itself behind
never takes one). One live replica, chosen the same way by all, then claims it: the claim
fences the silent owner (:mod:`tracker.fencing`), so an owner that was only frozen
redelivers nothing more from it when it wakes, and the group's next assignment settles
who keeps it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from tracker.handover import CLOCK_WINDOW_S

_OWNS = b"owns "
_READY = b"ready "

MAX_OWNED = 4096
"""At most this many partitions are named by one owns entry (the rest are not adopted
early; the group still moves them)."""


STALE_VIEW_S = 15.0
"""How long without reading an own beacon back a replica's view of who holds what still
counts: longer than one turn of a busy run loop (up to 11.8 s in full chaos run 51, where a
2 s bound let a replica that had just ended a 3 s turn take a partition back from a live
adopter)."""


def owns_text(clock: int, partitions: Iterable[int]) -> bytes:
    """The text of an *owns* entry: the replica whose clock is ``clock`` (its beacon's)
    holds ``partitions``."""
    listed = sorted(set(partitions))[:MAX_OWNED]
    return _OWNS + b"%d %s" % (clock, b",".join(b"%d" % p for p in listed))


def parse_owns(text: bytes) -> tuple[int, frozenset[int]] | None:
    """``(clock, partitions)`` from an *owns* entry's text; ``None`` for any other text."""
    if not text.startswith(_OWNS):
        return None
    clock, sep, listed = text[len(_OWNS) :].partition(b" ")
    if not sep or not clock.isdigit() or len(clock) > 10:
        return None
    partitions: set[int] = set()
    if listed:
        for part in listed.split(b","):
            if not part.isdigit() or len(part) > 9:
                return None
            partitions.add(int(part))
    if len(partitions) > MAX_OWNED:
        return None
    return int(clock), frozenset(partitions)


def ready_text(clock: int, partitions: Iterable[int]) -> bytes:
    """The text of a *ready* entry, written beside the owns entry: of the partitions the
    replica whose clock is ``clock`` holds, those it has replayed to their end, so that it
    could redeliver from them at once (a holder hands one over only then: :mod:`tracker.
    daemon`, Handoff)."""
    return _READY + owns_text(clock, partitions)[len(_OWNS) :]


def parse_ready(text: bytes) -> tuple[int, frozenset[int]] | None:
    """``(clock, partitions)`` from a *ready* entry's text; ``None`` for any other text."""
    if not text.startswith(_READY):
        return None
    return parse_owns(_OWNS + text[len(_READY) :])


def _rank(clock: int, partition: int) -> bytes:
    return hashlib.blake2b(b"%d:%d" % (clock, partition), digest_size=8).digest()


class OwnerWatch:
    """Who holds which markers partition, from the *owns* entries read live.

    Feed it every *owns* entry read as it comes (not in a replay) with :meth:`heard`,
    this replica's own included; ask :meth:`orphans` which partitions to adopt.
    """

    def __init__(self, own: int, silence_s: float, window_s: float = CLOCK_WINDOW_S) -> None:
        self.own = own
        self.silence_s = silence_s
        """How long a partition may go unnamed before it is an orphan."""
        self.window_s = window_s
        """Only partitions named within this long are adopted: one nobody has named for
        longer is not taken from a silent owner but left to the group."""
        self._named: dict[int, tuple[float, int]] = {}  # partition -> (read at, by clock)
        self._heard: dict[int, tuple[float, int]] = {}  # clock -> (read at, partitions named)
        self._latest: dict[int, tuple[float, frozenset[int]]] = {}
        """clock -> (sent at, partitions) of its newest owns entry, by its own send time
        (entries on different partitions are read in no particular order)."""
        self._current = float("-inf")
        """The send time (own clock) of the newest own beacon read back: every beacon
        written before it was on the broker, has been read."""
        self._ready: dict[int, tuple[float, frozenset[int]]] = {}
        """clock -> (sent at, partitions) of its newest *ready* entry. A clock missing
        here writes none (a replica of kmq before them)."""

    def heard(self, clock: int, partitions: frozenset[int], sent_s: float, now: float) -> None:
        """An *owns* entry of ``clock`` naming ``partitions``, sent at ``sent_s`` on its
        writer's clock, was read at ``now``."""
        if clock == self.own:
            self._current = max(self._current, sent_s)
        self._heard[clock] = (now, len(partitions))
        latest = self._latest.get(clock)
        if latest is None or sent_s >= latest[0]:
            self._latest[clock] = (sent_s, partitions)
        named = self._named
        for partition in partitions:
            named[partition] = (now, clock)

    def heard_ready(
        self, clock: int, partitions: frozenset[int], sent_s: float, now: float
    ) -> None:
        """A *ready* entry of ``clock`` naming ``partitions``, sent at ``sent_s`` on its
        writer's clock, was read at ``now`` (beside an owns entry, fed to :meth:`heard`)."""
        latest = self._ready.get(clock)
        if latest is None or sent_s >= latest[0]:
            self._ready[clock] = (sent_s, partitions)

    def ready_elsewhere(self, now: float) -> set[int]:
        """Of :meth:`named_elsewhere`, the partitions whose namer can redeliver from them at
        once: it names them in its newest *ready* entry too (it has replayed them), or it
        writes no ready entries at all (a replica before them, which never says)."""
        current, silence, own = self._current, self.silence_s, self.own
        if now - current >= STALE_VIEW_S:
            return set()
        out: set[int] = set()
        for clock, (_, partitions) in self._latest.items():
            if clock == own or current - self._heard[clock][0] >= silence:
                continue
            ready = self._ready.get(clock)
            out |= partitions if ready is None else partitions & ready[1]
        return out

    def orphans(self, now: float, mine: Iterable[int]) -> list[int]:
        """The partitions this replica should adopt now: named lately, last by another
        replica of which no beacon was read in the :attr:`silence_s` before the newest own
        beacon read back, not held here already, and for which this replica ranks first
        among the live replicas that hold partitions (all of which read beacons). One that
        ranks lower adopts after twice the silence, should the first not have done so.

        A partition this replica named last is never adopted back: it gave it up itself
        (a cooperative rebalance moves it in two steps, seconds apart), or was fenced on
        it, and then the group decides (:class:`tracker.fencing.FenceWatch`)."""
        held = set(mine)
        current, silence, heard = self._current, self.silence_s, self._heard
        live = [
            clock
            for clock, (at, count) in heard.items()
            if count and clock != self.own and current - at < silence
        ]
        out = []
        for partition, (at, namer) in self._named.items():
            quiet = current - at
            if partition in held or namer == self.own or quiet < silence:
                continue
            if now - at > self.window_s or current - heard[namer][0] < silence:
                continue  # long ago; or its owner, heard lately, has let it go
            first = min([self.own, *live], key=lambda c: _rank(c, partition))
            if first == self.own or quiet >= 2 * silence:
                out.append(partition)
        return sorted(out)

    def held_elsewhere(self, now: float) -> set[int]:
        """The partitions another replica named last, within :attr:`silence_s` before the
        newest own beacon read back: held by a live replica. None while that beacon is
        older than :data:`STALE_VIEW_S` at ``now``: a replica that reads nothing new (it
        holds no other partition, say) cannot tell whether that replica still lives."""
        current, silence, own = self._current, self.silence_s, self.own
        if now - current >= STALE_VIEW_S:
            return set()
        return {
            partition
            for partition, (at, namer) in self._named.items()
            if namer != own and current - at < silence
        }

    def clear_to_claim(self, partition: int, now: float) -> bool:
        """Whether this replica may claim ``partition`` now without cutting into a live
        replica's transaction on it: no other replica heard from within
        :attr:`silence_s` before the newest own beacon read back names it in its newest
        owns entry. A holder names its partitions until it has let them go, and lets one go
        only between transactions, so the claim cannot end one of them while it commits
        (which, on the embedded broker, holds the partition's readers for good). False
        while the view is older than :data:`STALE_VIEW_S`, or was never formed (a replica
        that has not yet read its own beacons back cannot tell)."""
        if now - self._current >= STALE_VIEW_S:
            return False
        return partition not in self.named_elsewhere(now)

    def named_elsewhere(self, now: float) -> set[int]:
        """The partitions that another replica heard from within :attr:`silence_s` before
        the newest own beacon read back names in its newest owns entry: it holds them
        still. Empty while the view is older than :data:`STALE_VIEW_S` (nothing can be told
        from it)."""
        current, silence, own = self._current, self.silence_s, self.own
        if now - current >= STALE_VIEW_S:
            return set()
        named: set[int] = set()
        for clock, (_, partitions) in self._latest.items():
            if clock != own and current - self._heard[clock][0] < silence:
                named |= partitions
        return named

    def reassigned(self, now: float, mine: Iterable[int]) -> None:
        """The group has just given this replica ``mine`` (and every other partition to
        another member, which names it at its first beacon): none of the others is adopted
        until :attr:`silence_s` passes from ``now`` without that. Adopting from the silent
        owner a partition the group has just given to a live replica, which has yet to
        say so, only sets the two claiming it in turn (in a full chaos run, redeliveries
        from it waited 15 s beyond their lease)."""
        held = set(mine)
        window = self.window_s
        for partition, (at, namer) in self._named.items():
            if partition not in held and now - at <= window:
                self._named[partition] = (now, namer)

    def forget_stale(self, now: float) -> None:
        """Drop what is older than :attr:`window_s` (replicas long gone)."""
        window = self.window_s
        for partition in [p for p, (at, _) in self._named.items() if now - at > window]:
            del self._named[partition]
        for clock in [c for c, (at, _) in self._heard.items() if now - at > window]:
            del self._heard[clock]
            self._latest.pop(clock, None)
            self._ready.pop(clock, None)
