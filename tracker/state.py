"""The tracker's pure core: one object per markers partition, no I/O, time passed in.

Deadlines are local monotonic seconds: a marker's lease runs from the moment the tracker
reads it. Client clocks (marker timestamps) never decide a deadline, so a skewed producer
can neither hasten nor postpone a redelivery; reading a marker late can only delay one.

The state keeps no payloads: a due delivery names its record (lane, partition, offset),
which the adapter re-reads from the queue or retry topic to redeliver it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sortedcontainers import SortedKeyList, SortedList

from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.errors import MarkerDecodeError
from kmq.markers import Entry, MarkerType, check_entry, parse
from kmq.records import delivery_key, fits_key, split_key
from tracker.handover import (
    HANDOVER_WAIT_S,
    ClockBounds,
    Handover,
    parse_beacon,
    parse_tick,
    tick_text,
)
from tracker.orphans import OwnerWatch, parse_owns, parse_ready

log = logging.getLogger(__name__)

Delivery = tuple[int, int, int]
"""A delivered record: (lane, partition, offset)."""


@dataclass(frozen=True, slots=True)
class Due:
    """A delivery whose deadline has passed: re-read its record, then redeliver it (or
    dead-letter it, once ``attempt + attempt_step`` would pass ``max_attempts``)."""

    marker_partition: int
    key: int
    """The delivery, as :func:`kmq.records.delivery_key` packs it."""
    start_offset: int
    """Where its START lies in the markers partition (for a watched copy: its WATCH, or
    -1 before that has been read)."""
    attempt_step: int
    """1 when the new copy counts as another attempt, 0 after a release."""
    reason: str
    max_attempts: int
    """From the START: 0 never dead-letters."""
    dead_letter_queue: str
    """From the START; empty for the default ``<queue>.dlq``."""
    unread_queue: str = ""
    """Set for a copy nobody has taken (see :meth:`PartitionState.redelivered`): its queue,
    so the adapter can tell whether its partition still has a live reader."""

    @property
    def delivery(self) -> Delivery:
        return split_key(self.key)


LEASE_EXPIRED_REASON = "lease expired"
"""The reason a REDELIVERED marker gives for a lease that ran out."""


@dataclass(slots=True, eq=False)
class _InFlight:
    key: int
    deadline: float
    start_offset: int
    max_attempts: int
    attempt_step: int = 1
    reason: str = LEASE_EXPIRED_REASON
    cause: str = "lease_expired"
    """What made it due, one of :data:`CAUSES` (``reason`` is free text)."""
    redelivering: bool = False


@dataclass(slots=True, eq=False)
class _Held:
    """A START held aside (see :attr:`PartitionState.young_s`)."""

    key: int
    offset: int
    entry: Entry
    text: bytes
    read_at: float
    deadline: float
    """From its lease, or from a KEEPALIVE read since."""


_by_deadline = operator.attrgetter("deadline")
_START = int(MarkerType.START)
_KEEPALIVE = int(MarkerType.KEEPALIVE)
_NACK = int(MarkerType.NACK)
_RELEASE = int(MarkerType.RELEASE)
_REJECT = int(MarkerType.REJECT)
_PROBE = int(MarkerType.PROBE)
_WATCH = int(MarkerType.WATCH)
READ_AT_STEP_S = 1.0
"""How far the reported read time of the oldest in-flight START may be early (the
oldest-in-flight-age gauge overstates by less than this)."""
PROBE_RETRY_S = 1.0
"""A probe not read back within this long is sent again (it may have been lost)."""
YOUNG_S = 0.5
"""How long a START waits, held aside, for its END before it gets a lease of its own (see
:attr:`PartitionState.young_s`)."""
MAX_HELD = 8192
"""The most STARTs held aside at once (ENDed ones waiting to reach the front included):
reaching it gives the older half their leases. Unbounded, a burst of 100,000 STARTs read
within ``young_s`` (a tracker catching up, as in the benchmark's memory run) were all held
before their leases were made, and the process kept the memory of both: 538 bytes of RSS
per message in flight, against 270 without holding and 292 with this bound. At 40,000
messages a second the older half is over 0.1 s old, so mostly ENDed already."""


def share_budget(deadlines: Mapping[int, list[float]], budget: int) -> dict[int, int]:
    """How many of each partition's due redeliveries (their ``deadlines``, earliest first)
    one round takes within ``budget``: the earliest deadlines of all partitions together,
    so that under a backlog no partition waits behind another's (oldest due goes first)."""
    taken: Counter[int] = Counter()
    merged = heapq.merge(*([(d, p) for d in ds] for p, ds in deadlines.items()))
    for _, partition in itertools.islice(merged, max(budget, 0)):
        taken[partition] += 1
    return dict(taken)


def floor_ms(t: float) -> int:
    """``t`` seconds in whole milliseconds, rounded down: ``floor_ms(t) / 1000 <= t`` even
    where ``t * 1000`` itself rounds up (1.9989999999999999 * 1000 == 1999.0)."""
    ms = max(0, int(t * 1000))
    while ms > 0 and ms / 1000 > t:
        ms -= 1
    return ms


_SETTLED = frozenset(
    int(t) for t in (MarkerType.END, MarkerType.REDELIVERED, MarkerType.DEAD_LETTERED)
)
_STAT = {int(t): t.name.lower() for t in MarkerType}
MARKER_TYPES = tuple(name for kind, name in _STAT.items() if kind != _PROBE)
"""The ``stats`` keys counting markers read, by type."""
CAUSES = ("lease_expired", "nacked", "released", "rejected", "unread")
"""Why a delivery was redelivered or dead-lettered: ``stats`` counts each outcome under
``redeliveries:<cause>`` and ``dead_letters:<cause>`` too."""
_MAX_LEASE_MS = MAX_REDELIVERY_TIMEOUT_S * 1000
_NO_START = -1
"""The START offset of a watched copy, which has none (never in ``_starts``)."""
UNREAD_REASON = "copy not read: no live consumer reads its partition"
"""The reason a watched copy's REDELIVERED marker gives when it is copied again."""
UNREAD_CHECKS = 15
"""How many times a copy nobody took is looked at, ``unread_s`` apart (with the default
2 s: every 2 s for 30 s after it was written), before it is no longer watched: a reader
stalled for a while can still take it or die, but one whose queue has no other reader has
nowhere better to go, and watching it for ever would only cost work. The waits do not
grow: a copy's queue often has no other live reader at first (its group rebalancing after
a kill), and it should move as soon as one is heard from, not at the next of a few
doubling checks (up to 16 s later, in chaos run 6). A look does no I/O: the adapter
reads cached metadata, the queue's layout and who was heard from."""


class PartitionState:
    """What one tracker knows about one markers partition.

    Feed it every record in offset order with :meth:`on_record`; ask :meth:`due` for the
    redeliveries to perform; report their outcome with :meth:`redelivered`,
    :meth:`redelivery_failed`, :meth:`postpone` or :meth:`discard`; commit
    :meth:`commit_offset`.
    """

    def __init__(
        self,
        partition: int,
        *,
        default_lease_s: float = 30.0,
        young_s: float = YOUNG_S,
        probe_nonce: int | None = None,
        clocks: ClockBounds | None = None,
        owners: OwnerWatch | None = None,
        unread_s: float = 0.0,
    ) -> None:
        self.partition = partition
        self.unread_s = unread_s
        """How long a copy a replayed WATCH marker names is watched before its first look
        (see :meth:`redelivered`); 0: replayed WATCH markers are ignored."""
        self.clocks = clocks
        """This replica's bounds on other replicas' clocks (shared by all its partitions),
        fed by the beacons read here; its ticks name ``clocks.own``."""
        self.owners = owners
        """Who holds which markers partition (shared by all its partitions), fed by the
        *owns* entries read here live (:mod:`tracker.orphans`)."""
        self._last_read_at = 0.0
        self.default_lease_s = default_lease_s
        self.probe_nonce = probe_nonce
        """This tracker's own mark on the PROBE markers it writes; ``None``: no probes (a
        deadline is due by the clock alone)."""
        self.horizon = float("inf") if probe_nonce is None else float("-inf")
        """The send time of the newest own PROBE read back: every marker written before then
        has been read, so deadlines up to it are decided by the log, not by how fast this
        tracker reads it."""
        self._probe_sent_at: float | None = None
        self._replay_probe_at: float | None = None
        self.position: int | None = None
        """Offset of the next marker to read."""
        self.end_offset: int | None = None
        """The replay gate: the partition's end when it was assigned."""
        self.stats: Counter[str] = Counter()
        self._inflight: dict[int, _InFlight] = {}  # by delivery key
        # In-flight entries by deadline; a keyed list holds no per-entry tuple.
        self._deadlines: SortedKeyList = SortedKeyList(key=_by_deadline)
        self._starts: SortedList = SortedList()  # marker offsets of in-flight STARTs
        # When in-flight STARTs were read: (START offset, read at), a new pair only once the
        # clock has moved READ_AT_STEP_S past the last (offsets and times come in order), the
        # first pair at or below the oldest in-flight START. A dict of every START's read
        # time cost 80 bytes per message in flight, for one gauge.
        self._read_marks: deque[tuple[int, float]] = deque()
        self.highwater: int | None = None
        """The partition's end, as the last fetch response told it (for the lag metric)."""
        self._dead_letter_queues: dict[int, str] = {}  # only for STARTs naming one
        self._unread: dict[int, tuple[str, int]] = {}  # watched copies: queue, checks left
        # Offsets of the WATCH markers of watched copies, read back or replayed: each holds
        # the commit point, so a successor replays it and watches the copy in turn.
        self._anchors: SortedList = SortedList()
        self.young_s = young_s
        """A START read (once the replay and its take-over are done) with a lease longer
        than this is held aside, by delivery, for this long: an END read meanwhile drops
        both for the price of two dict operations, where a lease costs an entry in each
        sorted structure and removing it again (most of the tracker's time when messages
        are acked within milliseconds). A KEEPALIVE moves a held START's deadline in place.
        Any other marker for it, a START that cannot be held, or age gives every held
        START its lease (and a full table, :data:`MAX_HELD`, its older half), in the order
        they were read and from when each was read, so
        nothing observable changes: deadlines, the commit offset and ``in_flight`` count
        held STARTs as leases. 0 holds none."""
        self._young: dict[int, _Held] = {}
        self._young_order: deque[_Held] = deque()
        """The held STARTs in the order read; ENDed ones stay until they reach the front."""
        self._handover: Handover | None = Handover()
        """While replaying, and for :data:`HANDOVER_WAIT_S` after: what the predecessors'
        ticks say about the leases replayed."""
        self._handover_until: float | None = None
        self.replay_leases: tuple[int, int] | None = None
        """Once the replay is over: the open leases it left, and how many of them no tick
        covered (each runs a full lease from its replay); the adapter logs and clears it."""
        self._clock_version = -1
        self._tick_sent_at: float | None = None

    # -- inputs -----------------------------------------------------------------------

    def set_position(self, offset: int) -> None:
        """Where reading starts (the committed offset); later calls are ignored."""
        if self.position is None:
            self.position = offset
            self._replay_moved()

    def skip_to(self, offset: int) -> None:
        """The consumer's position moved past records it does not hand out (a transaction's
        commit or abort marker, aborted records): the partition has been read up to here."""
        if self.position is not None and offset > self.position:
            self.position = offset
            self._replay_moved()

    def set_end_offset(self, end: int) -> None:
        """The high watermark seen first after assignment; later calls are ignored."""
        if self.end_offset is None:
            self.end_offset = end
            self._replay_moved()

    def _replay_moved(self) -> None:
        """Where the replay may have ended: take over what the predecessors' ticks cover."""
        if self._handover is not None and not self.replaying:
            self._take_over()

    def regate(self, nonce: int) -> None:
        """Claimed again after a rebalance it was kept through: another replica may have
        redelivered from it in between. Act on no deadline until a PROBE written after the
        claim is read back: those carry the new ``nonce``, so earlier ones no longer count."""
        self.probe_nonce = nonce
        self.horizon = float("-inf")
        self._probe_sent_at = None
        self._replay_probe_at = None

    @property
    def replaying(self) -> bool:
        """True until everything that was in the partition at assignment has been read."""
        return self.end_offset is None or self.position is None or self.position < self.end_offset

    def on_record(self, offset: int, value: bytes | None, now: float) -> None:
        """Apply the marker record at ``offset``. Never raises on bad input."""
        if self.position is not None and offset < self.position:
            self.stats["reread"] += 1
            return
        replayed = self.replaying  # this record was in the partition at assignment
        self.position = offset + 1
        self._last_read_at = now
        try:
            entries, texts = parse(value)
        except MarkerDecodeError as exc:
            self._bad(offset, exc)
            self._replay_moved()
            return
        if len(entries) > 1:
            self.stats["batch"] += 1
        self._promote_aged(now)
        for entry, text in zip(entries, texts, strict=True):
            if entry[0] == _PROBE:
                self._on_probe(entry, text, now, replayed)
                continue
            problem = check_entry(entry)
            if problem is None and not fits_key(entry[2], entry[3]):
                problem = f"it names an impossible record {entry[2]}:{entry[3]}"
            if problem is not None:
                self._bad(offset, problem)
                continue
            if entry[0] == _WATCH:
                self._on_watch(offset, entry, text, now, replayed)
                continue
            self._apply(offset, entry, text, now)
        if self._handover is not None and not self.replaying:
            self._take_over()  # _replay_moved, inlined: this runs for every marker

    def _bad(self, offset: int, problem: object) -> None:
        self.stats["bad_marker"] += 1
        log.warning("markers partition %d offset %d skipped: %s", self.partition, offset, problem)

    def _apply(self, offset: int, entry: Entry, text: bytes, now: float) -> None:
        kind = entry[0]
        self.stats[_STAT[kind]] += 1
        delivery = delivery_key(entry[1], entry[2], entry[3])
        young = self._young
        if kind == _START:
            lease_s = entry[5] / 1000
            if len(self._young_order) >= MAX_HELD:
                self._promote(keep=MAX_HELD // 2)
            if (
                self._handover is None
                and self._holds(lease_s)
                and entry[4] >= 1
                and delivery not in self._inflight
                and delivery not in young
            ):
                held = young[delivery] = _Held(delivery, offset, entry, text, now, now + lease_s)
                self._young_order.append(held)
                return
            if young:
                self._promote()
            self._on_start(offset, entry, text, delivery, now)
            return
        if young and delivery in young:
            if kind in _SETTLED:
                del young[delivery]
                return
            if kind == _KEEPALIVE:
                lease_s = entry[5] / 1000
                if self._holds(lease_s):  # still due only after it would get its lease
                    young[delivery].deadline = now + lease_s
                    return
            self._promote()
        inflight = self._inflight.get(delivery)
        if inflight is None:
            # Normal after a restart (the START lies before the commit point), after our own
            # REDELIVERED marker, or when a lease already expired; anything else is a client bug.
            self.stats["unknown_delivery"] += 1
            return
        if kind in _SETTLED:
            self._drop(delivery, inflight)
            return
        if inflight.redelivering:
            self.stats["late_marker"] += 1
            return
        if kind == _KEEPALIVE:
            lease_s = self._lease_s(entry[5])
            self._reschedule(inflight, now + lease_s)
            if self._handover is not None:
                self._handover.leased(offset, delivery, lease_s)
            return
        if self._handover is not None:
            self._handover.forget(delivery)
        if kind == _NACK:
            inflight.attempt_step, inflight.cause = 1, "nacked"
            inflight.reason = text.decode("utf-8", "replace") or "nacked"
            self._reschedule(inflight, now + self._delay_s(entry[5]))
        elif kind == _RELEASE:
            inflight.attempt_step, inflight.cause = 0, "released"
            inflight.reason = text.decode("utf-8", "replace") or "released"
            self._reschedule(inflight, now)
        elif kind == _REJECT:
            # Dead-letter now: out of attempts whatever attempt it is on.
            inflight.attempt_step, inflight.max_attempts = 1, 1
            inflight.cause = "rejected"
            inflight.reason = text.decode("utf-8", "replace") or "rejected"
            self._reschedule(inflight, now)

    def _on_watch(self, offset: int, entry: Entry, text: bytes, now: float, replayed: bool) -> None:
        """A WATCH marker: the copy a redelivery wrote. Read back by the tracker that wrote
        it, it anchors that copy's watch here; replayed by a successor, it starts watching
        the copy afresh (the copy's START, if it was taken, lies after it and turns the
        watch into a lease as usual)."""
        self.stats["watch"] += 1
        copy = delivery_key(entry[1], entry[2], entry[3])
        inflight = self._inflight.get(copy)
        if inflight is not None:
            if copy in self._unread and inflight.start_offset == _NO_START:
                inflight.start_offset = offset
                self._anchors.add(offset)
            return
        # Read live, a WATCH of a copy not watched (taken, or no longer watched) is spent: only
        # this owner writes to its partition once the replay is over.
        if not replayed or self.unread_s <= 0 or copy in self._young:
            return
        self._watch(copy, now + self.unread_s, offset, entry[6], text.decode("utf-8", "replace"))
        self._anchors.add(offset)
        self.stats["watch_replayed"] += 1

    def _watch(
        self, copy: int, deadline: float, offset: int, max_attempts: int, queue: str
    ) -> None:
        """Start watching ``copy`` (its WATCH at ``offset``, or ``_NO_START``)."""
        watch = self._inflight[copy] = _InFlight(
            copy, deadline, offset, max_attempts, attempt_step=0,
            reason=UNREAD_REASON, cause="unread",
        )  # fmt: skip
        self._deadlines.add(watch)
        self._unread[copy] = (queue, UNREAD_CHECKS)

    def redelivered(
        self,
        key: int,
        *,
        dead_lettered: bool = False,
        copy: int | None = None,
        queue: str = "",
        now: float = 0.0,
        unread_s: float = 0.0,
    ) -> None:
        """The new copy (or dead letter) and its marker are on the broker: forget the delivery
        (if it is still the one being redelivered: settled and STARTed afresh meanwhile, the
        new entry is another delivery's and stays).

        With ``copy`` (the copy's delivery key) and ``unread_s`` > 0, watch the copy until
        a consumer STARTs it: one not taken within ``unread_s`` comes out of :meth:`due`
        (with its ``queue``) to be copied again, to a partition someone reads, if the
        adapter finds that its own has no live reader. Not a lease: it holds no consumer's
        delivery. A copy sent to a spare also has a WATCH marker, written in the same
        transaction, which carries the watch over a restart or a rebalance: read back, it
        holds the commit point (see :meth:`_on_watch`); the watch on any other copy is
        forgotten then (its queue partition's next owner reads it)."""
        inflight = self._inflight.get(key)
        if inflight is None or not inflight.redelivering:
            return  # settled meanwhile, and maybe STARTed afresh: not this redelivery's
        dead_letter_queue = self._dead_letter_queues.get(key)
        self._drop(key, inflight)
        outcome = "dead_letters" if dead_lettered else "redeliveries"
        self.stats[outcome] += 1
        self.stats[f"{outcome}:{inflight.cause}"] += 1
        if (
            copy is None
            or unread_s <= 0
            or dead_lettered
            or copy in self._inflight
            or copy in self._young
        ):
            return
        self._watch(copy, now + unread_s, _NO_START, inflight.max_attempts, queue)
        if dead_letter_queue is not None:
            self._dead_letter_queues[copy] = dead_letter_queue

    def discard(self, key: int, why: str) -> None:
        """Forget a delivery being redelivered (taken by :meth:`due`) that cannot be (its
        record is gone), counting ``why``; one settled and STARTed afresh meanwhile stays."""
        inflight = self._inflight.get(key)
        if inflight is not None and inflight.redelivering:
            self._drop(key, inflight)
            self.stats[why] += 1

    def redelivery_failed(self, key: int, now: float, retry_after_s: float) -> None:
        """The redelivery did not go through: try again after ``retry_after_s``."""
        self._retry(key, now + retry_after_s, "redelivery_failed")

    def postpone(self, key: int, until: float, why: str = "postponed") -> None:
        """Hold a due redelivery (its queue is paused, say) until ``until``."""
        self._retry(key, until, why)

    def keep_watching(
        self, key: int, now: float, unread_s: float, *, until_taken: bool = False
    ) -> None:
        """A watched copy came due but needs no second copy yet (its reader is alive, or
        no one else reads its queue): look again ``unread_s`` later, :data:`UNREAD_CHECKS`
        times in all, then stop watching it. With ``until_taken`` (a copy on a partition
        that no reader of its queue is given when its group settles: a spare), look again
        for as long as it is not taken."""
        watched = self._unread.get(key)
        if watched is None:
            return
        queue, checks = watched
        if not until_taken:
            if checks <= 1:
                self.discard(key, "unread_unwatched")
                return
            self._unread[key] = (queue, checks - 1)
        self._retry(key, now + unread_s, "unread_waits")

    # -- outputs ----------------------------------------------------------------------

    def due(self, now: float, limit: int = 1000) -> list[Due]:
        """Redeliveries whose deadline has passed, by the clock and by the log (see
        :attr:`horizon`); none while replaying."""
        cutoff = self._due_cutoff(now)
        if cutoff is None:
            return []
        out: list[Due] = []
        deadlines = self._deadlines
        while deadlines and len(out) < limit:
            inflight = deadlines[0]
            if inflight.deadline > cutoff:
                break
            del deadlines[0]
            inflight.redelivering = True
            out.append(
                Due(
                    marker_partition=self.partition,
                    key=inflight.key,
                    start_offset=inflight.start_offset,
                    attempt_step=inflight.attempt_step,
                    reason=inflight.reason,
                    max_attempts=inflight.max_attempts,
                    dead_letter_queue=self._dead_letter_queues.get(inflight.key, ""),
                    unread_queue=self._unread[inflight.key][0]
                    if self._unread and inflight.key in self._unread
                    else "",
                )
            )
        return out

    def due_deadlines(self, now: float, limit: int = 1000) -> list[float]:
        """The deadlines of what :meth:`due` would return now, earliest first, without
        taking anything: what :func:`share_budget` weighs partitions by."""
        cutoff = self._due_cutoff(now)
        if cutoff is None:
            return []
        out: list[float] = []
        for inflight in self._deadlines.islice(0, limit):
            if inflight.deadline > cutoff:
                break
            out.append(float(inflight.deadline))
        return out

    def _due_cutoff(self, now: float) -> float | None:
        """The latest deadline due now, by the clock and by the log; None while replaying
        (nothing is due then)."""
        if self.replaying:
            return None
        self._promote_aged(now)
        return min(now, self.horizon)

    def probe_needed(self, now: float) -> bool:
        """Whether a deadline has passed by the clock but not yet by the log, and no probe
        is on its way: then write :meth:`probe` and redeliver once it is read back."""
        if self.probe_nonce is None or self.replaying:
            return False
        self._promote_aged(now)
        if not self._deadlines:
            return False
        first = float(self._deadlines[0].deadline)
        if first > now or first <= self.horizon:
            return False
        sent = self._probe_sent_at
        return sent is None or now - sent >= PROBE_RETRY_S or sent < first

    def replay_probe_needed(self, now: float) -> bool:
        """While the partition replays (claimed: the adapter asks only then), whether to
        write a :meth:`probe` now, at most one per :data:`PROBE_RETRY_S`. It is read back
        right behind the replay, so the leases the replay finds overdue (a dead holder's,
        taken over from its ticks) go out as it ends, not a probe's round trip later,
        which on a starved 2-core machine took 2 to 5 s (the full chaos runs' tracker kills)."""
        if self.probe_nonce is None or not self.replaying:
            return False
        sent = self._replay_probe_at
        return sent is None or now - sent >= PROBE_RETRY_S

    def probe(self, now: float) -> Entry:
        """The PROBE marker to write to this partition now (its send time in whole ms,
        rounded down, so the horizon never runs ahead of the truth)."""
        entry = self._probe_entry(now)
        self._probe_sent_at = now
        if self.replaying:
            self._replay_probe_at = now
        self.stats["probe_sent"] += 1
        return entry

    def tick(self, now: float, acked: tuple[int, float] | None) -> tuple[Entry, bytes]:
        """A tick to write now (see :meth:`tick_needed`) and its text: a PROBE that also says
        an earlier one of this owner, ``acked`` = ``(offset, acknowledged at)``, was on the
        broker by then, so a successor need not start the leases before it afresh
        (:mod:`tracker.handover`). It is read back like any PROBE of this owner."""
        text = tick_text(floor_ms(now), acked, None if self.clocks is None else self.clocks.own)
        entry = self._probe_entry(now, text)
        self._tick_sent_at = now
        self.stats["tick_sent"] += 1
        return entry, text

    def _probe_entry(self, now: float, text: bytes = b"") -> Entry:
        if self.probe_nonce is None:
            raise ValueError("this state writes no probes")
        return (_PROBE, 0, self.partition, floor_ms(now), self.probe_nonce, 0, 0, len(text))

    def tick_needed(self, now: float, interval_s: float) -> bool:
        """Whether this owner should write a tick: it has deliveries in flight and wrote no
        tick for ``interval_s``. None while replaying."""
        if interval_s <= 0 or self.probe_nonce is None or self.replaying:
            return False
        if not self._inflight and not self._young:
            return False
        sent = self._tick_sent_at
        return sent is None or now - sent >= interval_s

    def _take_over(self) -> None:
        """The replay is over: bring forward the deadlines the predecessors' ticks cover,
        and again as beacons bring closer bounds on their clocks, for a while."""
        handover, clocks, now = self._handover, self.clocks, self._last_read_at
        if handover is None:
            return
        until = self._handover_until
        first = until is None
        if until is None:  # the replay just ended
            until = self._handover_until = now + (HANDOVER_WAIT_S if clocks is not None else 0.0)
        elif now > until:
            self._handover = None
            return
        elif clocks is None or clocks.version == self._clock_version:
            return
        if clocks is not None:
            self._clock_version = clocks.version
        if now >= until:
            self._handover = None
        covered: set[int] = set()
        for key, deadline in handover.deadlines(clocks, now):
            inflight = self._inflight.get(key)
            if inflight is not None and not inflight.redelivering and deadline < inflight.deadline:
                self._reschedule(inflight, deadline)
                self.stats["lease_taken_over"] += 1
                covered.add(key)
        if first:
            open_leases = [
                key
                for key in handover.marked()
                if (inflight := self._inflight.get(key)) is not None and not inflight.redelivering
            ]
            uncovered = sum(1 for key in open_leases if key not in covered)
            self.stats["lease_replayed"] += len(open_leases)
            self.stats["lease_uncovered"] += uncovered
            self.replay_leases = (len(open_leases), uncovered)

    def _on_probe(self, entry: Entry, text: bytes, now: float, replayed: bool) -> None:
        if text and entry[4] == 0:  # no tracker's: a consumer's "still here", or a beacon
            beacon = parse_beacon(entry[3], text)
            if beacon is not None:
                self.stats["beacon_read"] += 1
                clock, known, acked = beacon
                if not replayed:
                    if self.clocks is not None:  # read at once: a close bound on that clock
                        self.clocks.observe(clock, entry[3], now, known)
                elif acked is not None and self._handover is not None:
                    # Another replica's tick: what it wrote here before was on the broker
                    # by then, and so was every marker before that, the predecessor's last
                    # ones too (written after its own last tick).
                    self.stats["tick_read"] += 1
                    self._handover.tick(clock, acked[0], acked[1], now)
            elif self.owners is not None and not replayed:
                owns = parse_owns(text)
                if owns is not None:
                    self.stats["owns_read"] += 1
                    self.owners.heard(owns[0], owns[1], entry[3] / 1000, now)
                else:
                    ready = parse_ready(text)
                    if ready is not None:
                        self.owners.heard_ready(ready[0], ready[1], entry[3] / 1000, now)
        elif self._handover is not None and text and replayed:
            tick = parse_tick(entry[3], text)
            if tick is not None:
                self.stats["tick_read"] += 1
                owner = entry[4] if tick[2] is None else tick[2]
                self._handover.tick(owner, tick[0], tick[1], now)
        if self.probe_nonce is not None and entry[4] == self.probe_nonce:
            self.stats["probe_read"] += 1
            self.horizon = max(self.horizon, entry[3] / 1000)
            if self._probe_sent_at is not None and entry[3] >= floor_ms(self._probe_sent_at):
                self._probe_sent_at = None
        else:
            self.stats["foreign_probe"] += 1

    def deadline_of(self, key: int) -> float | None:
        """When ``key`` comes due (by the clock); ``None`` if it is not in flight."""
        inflight = self._inflight.get(key)
        if inflight is None:
            held = self._young.get(key)
            return None if held is None else held.deadline
        return float(inflight.deadline)

    def next_deadline(self, after: float | None = None) -> float | None:
        """The earliest deadline (by the clock), or the earliest later than ``after``;
        ``None`` if there is none. Looks at every held START: see :meth:`next_wake`."""
        first = self._next_lease_deadline(after)
        floor = -float("inf") if after is None else after
        later = [h.deadline for h in self._young.values() if h.deadline > floor]
        if first is not None:
            later.append(first)
        return min(later) if later else None

    def first_lease_deadline(self, now: float) -> float | None:
        """The earliest deadline of a lease (by the clock), the held STARTs read
        ``young_s`` or more before ``now`` given theirs; ``None`` if none runs."""
        self._promote_aged(now)
        return self._next_lease_deadline(None)

    def next_wake(self, now: float) -> float | None:
        """When the adapter's loop must look again, at the latest: the earliest deadline
        later than ``now``, or sooner, when the oldest held START gets its lease (none can
        come due before that). ``None`` if there is neither. Gives the held STARTs read
        ``young_s`` or more before ``now`` their leases first."""
        self._promote_aged(now)
        first = self._next_lease_deadline(now)
        held = self._first_held()
        if held is None:
            return first
        bound = held.read_at + self.young_s  # later than now: older ones got their lease above
        return bound if first is None else min(first, bound)

    def _next_lease_deadline(self, after: float | None) -> float | None:
        deadlines = self._deadlines
        i = 0 if after is None else deadlines.bisect_key_right(after)
        return float(deadlines[i].deadline) if i < len(deadlines) else None

    def commit_offset(self, settled: Iterable[int] = ()) -> int | None:
        """The offset a restart must replay from: the oldest in-flight START (or WATCH of a
        watched copy), else the end.

        ``settled``: START offsets, one per delivery, to count as finished already (for a
        commit that goes in the same transaction as their redelivery). Several STARTs can
        share one offset (a record holds many markers), so they are counted, not looked up.
        """
        pending = Counter(settled)
        anchor = None  # the oldest WATCH of a watched copy (see _on_watch)
        for watch in self._anchors:
            if pending[watch] > 0:
                pending[watch] -= 1
                continue
            anchor = int(watch)
            break
        oldest = self._oldest_start(pending)
        if anchor is None:
            return oldest
        return anchor if oldest is None else min(anchor, oldest)

    def _oldest_start(self, pending: Counter[int]) -> int | None:
        for start in self._starts:
            if pending[start] > 0:
                pending[start] -= 1
                continue
            return int(start)
        self._first_held()  # lets go of ENDed ones at the front
        young = self._young
        for held in self._young_order:  # each read after every START with a lease
            if young.get(held.key) is not held:
                continue
            if pending[held.offset] > 0:
                pending[held.offset] -= 1
                continue
            return held.offset
        return self.position

    @property
    def in_flight(self) -> int:
        """Deliveries consumers hold (watched copies, which nobody holds yet, are not)."""
        return len(self._inflight) + len(self._young) - len(self._unread)

    @property
    def watched(self) -> int:
        """Copies written and not yet taken that are watched (see :meth:`redelivered`)."""
        return len(self._unread)

    def oldest_read_at(self) -> float | None:
        """When the oldest in-flight START was read (this tracker's monotonic clock), at
        most READ_AT_STEP_S early. Safe to call from another thread."""
        try:
            if self._starts:
                return self._read_marks[0][1]
            # The front may have been ENDed, but it goes once young_s old (each round).
            return self._young_order[0].read_at if self._young else None
        except IndexError:  # emptied meanwhile by the run loop
            return None

    def deliveries(self) -> list[Delivery]:
        held = [split_key(key) for key in self._young]
        return [split_key(key) for key in self._inflight if key not in self._unread] + held

    # -- internals --------------------------------------------------------------------

    def _holds(self, lease_s: float) -> bool:
        """Whether a START (or KEEPALIVE) with this lease may be held: one that would not
        be due before it gets its lease by age, and is not bad (see :meth:`_lease_s`)."""
        return 0 < self.young_s < lease_s <= MAX_REDELIVERY_TIMEOUT_S

    def _promote_aged(self, now: float) -> None:
        """Give the held STARTs read ``young_s`` or more before ``now`` their leases."""
        if self._young_order:
            self._promote(now - self.young_s)

    def _promote(self, read_by: float = float("inf"), *, keep: int = 0) -> None:
        """Give the held STARTs read at or before ``read_by`` their leases, oldest first,
        stopping once ``keep`` are held (ENDed ones counted until they reach the front)."""
        order, young = self._young_order, self._young
        while len(order) > keep and order[0].read_at <= read_by:
            held = order.popleft()
            key = held.key
            if young.get(key) is held:
                del young[key]
                self._on_start(held.offset, held.entry, held.text, key, held.read_at)
                if held.deadline != held.read_at + held.entry[5] / 1000:  # a KEEPALIVE's
                    self._reschedule(self._inflight[key], held.deadline)

    def _first_held(self) -> _Held | None:
        """The oldest START still held (those ENDed meanwhile are let go of here)."""
        order, young = self._young_order, self._young
        while order:
            held = order[0]
            if young.get(held.key) is held:
                return held
            order.popleft()
        return None

    def _on_start(self, offset: int, entry: Entry, text: bytes, delivery: int, now: float) -> None:
        if entry[4] < 1:
            self.stats["bad_attempt"] += 1  # the record's own attempt header decides
        lease_s = self._lease_s(entry[5])
        deadline = now + lease_s
        inflight = self._inflight.get(delivery)
        handover = self._handover
        if inflight is not None and not inflight.redelivering and delivery in self._unread:
            # A watched copy taken after all: from now on it is a delivery like any other.
            # (One being copied again right now stays a watch: turned into a lease, a failed
            # copy would bring it due again after a retry interval, sooner than its lease.)
            del self._unread[delivery]
            if inflight.start_offset != _NO_START:
                self._anchors.discard(inflight.start_offset)
            self.stats["unread_taken"] += 1
            self._starts.add(offset)
            self._note_read(offset, now)
            inflight.start_offset, inflight.max_attempts = offset, entry[6]
            inflight.attempt_step = 1
            inflight.reason, inflight.cause = LEASE_EXPIRED_REASON, "lease_expired"
            if text:
                self._dead_letter_queues[delivery] = text.decode("utf-8", "replace")
            self._reschedule(inflight, deadline)
            if handover is not None:
                handover.leased(offset, delivery, lease_s)
            return
        if inflight is not None:
            # The same record started twice: a consumer died between START and offset commit,
            # or a rebalance handed the record to a second consumer. One lease covers both.
            self.stats["duplicate_start"] += 1
            if handover is not None:
                handover.forget(delivery)
            if not inflight.redelivering:
                self._reschedule(inflight, max(inflight.deadline, deadline))
            return
        inflight = self._inflight[delivery] = _InFlight(delivery, deadline, offset, entry[6])
        if text:
            self._dead_letter_queues[delivery] = text.decode("utf-8", "replace")
        self._deadlines.add(inflight)
        self._starts.add(offset)
        self._note_read(offset, now)
        if handover is not None:
            handover.leased(offset, delivery, lease_s)

    def _note_read(self, offset: int, now: float) -> None:
        marks = self._read_marks
        if not marks or now - marks[-1][1] >= READ_AT_STEP_S:
            marks.append((offset, now))

    def _lease_s(self, ms: int) -> float:
        if 0 < ms <= _MAX_LEASE_MS:
            return ms / 1000
        # Losing track of the message would be worse than guessing its lease.
        self.stats["bad_lease"] += 1
        return self.default_lease_s

    def _delay_s(self, ms: int) -> float:
        if 0 <= ms <= _MAX_LEASE_MS:
            return ms / 1000
        self.stats["bad_lease"] += 1
        return 0.0 if ms < 0 else MAX_REDELIVERY_TIMEOUT_S

    def _retry(self, key: int, deadline: float, why: str) -> None:
        inflight = self._inflight.get(key)
        if inflight is not None and inflight.redelivering:
            inflight.redelivering = False
            self.stats[why] += 1
            self._reschedule(inflight, deadline)

    def _reschedule(self, inflight: _InFlight, deadline: float) -> None:
        if not inflight.redelivering:
            self._deadlines.discard(inflight)
        inflight.deadline = deadline
        self._deadlines.add(inflight)

    def _drop(self, key: int, inflight: _InFlight) -> None:
        del self._inflight[key]
        if self._handover is not None:
            self._handover.forget(key)  # a replay's bookkeeping holds no settled delivery
        if not inflight.redelivering:
            self._deadlines.discard(inflight)
        if self._dead_letter_queues:
            self._dead_letter_queues.pop(key, None)
        if self._unread and key in self._unread:  # a watch: its offset is its WATCH's
            del self._unread[key]
            if inflight.start_offset != _NO_START:
                self._anchors.discard(inflight.start_offset)
            return
        starts = self._starts
        starts.discard(inflight.start_offset)
        marks = self._read_marks
        if not starts:
            marks.clear()
        else:
            oldest = starts[0]
            while len(marks) > 1 and marks[1][0] <= oldest:
                marks.popleft()
