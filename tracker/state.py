"""The tracker's pure core: one object per markers partition, no I/O, time passed in.

Deadlines are local monotonic seconds: a marker's lease runs from the moment the tracker
reads it. Client clocks (marker timestamps) never decide a deadline, so a skewed producer
can neither hasten nor postpone a redelivery; reading a marker late can only delay one.
"""

from __future__ import annotations

import logging
import operator
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from sortedcontainers import SortedKeyList, SortedList

from kmq._proto import marker_pb2
from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.errors import MarkerDecodeError
from kmq.markers import BATCH, MAX_ATTEMPT, Marker, MarkerType, check, from_pb, parse
from kmq.policy import DEAD_LETTER_SUFFIX

log = logging.getLogger(__name__)

Delivery = tuple[int, int]
"""A delivered queue-topic record: (partition, offset)."""

_OFFSET_BITS = 48
_MAX_PARTITION = 2**15 - 1
_OFFSET_MASK = 2**_OFFSET_BITS - 1


def _key(partition: int, offset: int) -> int:
    # One int per delivery instead of a tuple of two: tens of bytes per in-flight message.
    return (partition << _OFFSET_BITS) | offset


def _delivery(key: int) -> Delivery:
    return (key >> _OFFSET_BITS, key & _OFFSET_MASK)


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Action: write a new copy of a message to the queue topic, then record that it was."""

    marker_partition: int
    delivery: Delivery
    queue: str
    message_id: str
    attempt: int
    """The attempt number the new copy carries."""
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    reason: str
    dead_letter_queue: str | None = None
    """Set when the message is out of attempts: move it to this queue instead."""
    start_offset: int = -1
    """Where the START marker lies in the markers partition (to re-read the payload)."""
    attempt_step: int = 1
    """1 when the new copy counts as another attempt, 0 after a release."""

    @property
    def complete(self) -> bool:
        """False for an action of a payload-free state: see :func:`complete`."""
        return bool(self.message_id)


def complete(action: Redeliver, start: Marker) -> Redeliver:
    """Fill ``action`` in from its START marker: who, what, which attempt, and whether it is
    out of attempts (then it goes to the dead-letter queue instead)."""
    attempt = max(start.attempt, 1) + action.attempt_step
    out_of_attempts = 0 < start.max_attempts < attempt
    return replace(
        action,
        queue=start.queue,
        message_id=start.message_id,
        attempt=max(start.attempt, 1) if out_of_attempts else min(attempt, MAX_ATTEMPT),
        key=start.key,
        value=start.value,
        headers=start.headers,
        dead_letter_queue=(start.dead_letter_queue or start.queue + DEAD_LETTER_SUFFIX)
        if out_of_attempts
        else None,
    )


@dataclass(slots=True, eq=False)
class _InFlight:
    key: int
    deadline: float
    start_offset: int
    start: Marker | None  # only when the state keeps payloads
    attempt_step: int = 1
    reason: str = "lease expired"
    redelivering: bool = False


_by_deadline = operator.attrgetter("deadline")
_START = int(MarkerType.START)
_KEEPALIVE = int(MarkerType.KEEPALIVE)
_NACK = int(MarkerType.NACK)
_RELEASE = int(MarkerType.RELEASE)
_SETTLED = frozenset(
    int(t) for t in (MarkerType.END, MarkerType.REDELIVERED, MarkerType.DEAD_LETTERED)
)
_STAT = {int(t): t.name.lower() for t in MarkerType}
_MAX_LEASE_MS = MAX_REDELIVERY_TIMEOUT_S * 1000


class PartitionState:
    """What one tracker knows about one markers partition.

    Feed it every record in offset order with :meth:`on_record`; ask :meth:`due` for the
    redeliveries to perform; report their outcome with :meth:`redelivered` or
    :meth:`redelivery_failed`; commit :meth:`commit_offset`.
    """

    def __init__(
        self, partition: int, *, default_lease_s: float = 30.0, keep_payloads: bool = True
    ) -> None:
        self.partition = partition
        self.default_lease_s = default_lease_s
        self.keep_payloads = keep_payloads
        """False: forget key, value and headers of each START; the caller re-reads them from
        the markers log (``Redeliver.start_offset``) when a redelivery is due."""
        self.position: int | None = None
        """Offset of the next marker to read."""
        self.end_offset: int | None = None
        """The replay gate: the partition's end when it was assigned."""
        self.stats: Counter[str] = Counter()
        self._inflight: dict[int, _InFlight] = {}  # by _key(partition, offset)
        # In-flight entries by deadline; a keyed list holds no per-entry tuple.
        self._deadlines: SortedKeyList = SortedKeyList(key=_by_deadline)
        self._starts: SortedList = SortedList()  # marker offsets of in-flight STARTs

    # -- inputs -----------------------------------------------------------------------

    def set_position(self, offset: int) -> None:
        """Where reading starts (the committed offset); later calls are ignored."""
        if self.position is None:
            self.position = offset

    def set_end_offset(self, end: int) -> None:
        """The high watermark seen first after assignment; later calls are ignored."""
        if self.end_offset is None:
            self.end_offset = end

    @property
    def replaying(self) -> bool:
        """True until everything that was in the partition at assignment has been read."""
        return self.end_offset is None or self.position is None or self.position < self.end_offset

    def on_record(self, offset: int, value: bytes | None, now: float) -> None:
        """Apply the marker record at ``offset``. Never raises on bad input."""
        if self.position is not None and offset < self.position:
            self.stats["reread"] += 1
            return
        self.position = offset + 1
        try:
            pb = parse(value)
        except MarkerDecodeError as exc:
            self._bad(offset, exc)
            return
        if pb.type != BATCH:
            self._apply(offset, pb, now)
            return
        self.stats["batch"] += 1
        for entry in pb.batch:
            try:
                check(entry)
            except MarkerDecodeError as exc:
                self._bad(offset, exc)
                continue
            self._apply(offset, entry, now)

    def _bad(self, offset: int, problem: object) -> None:
        self.stats["bad_marker"] += 1
        log.warning("markers partition %d offset %d skipped: %s", self.partition, offset, problem)

    def _apply(self, offset: int, pb: marker_pb2.Marker, now: float) -> None:
        kind = pb.type
        if pb.partition > _MAX_PARTITION or pb.offset > _OFFSET_MASK:
            self._bad(offset, "it names an impossible record")
            return
        self.stats[_STAT[kind]] += 1
        delivery = _key(pb.partition, pb.offset)
        if kind == _START:
            self._on_start(offset, pb, delivery, now)
            return
        entry = self._inflight.get(delivery)
        if entry is None:
            # Normal after a restart (the START lies before the commit point), after our own
            # REDELIVERED marker, or when a lease already expired; anything else is a client bug.
            self.stats["unknown_delivery"] += 1
            return
        if kind in _SETTLED:
            self._drop(delivery, entry)
        elif entry.redelivering:
            self.stats["late_marker"] += 1
        elif kind == _KEEPALIVE:
            self._reschedule(delivery, entry, now + self._lease_s(pb.redeliver_after_ms))
        elif kind == _NACK:
            entry.attempt_step, entry.reason = 1, pb.reason or "nacked"
            self._reschedule(delivery, entry, now + self._delay_s(pb.redeliver_after_ms))
        elif kind == _RELEASE:
            entry.attempt_step, entry.reason = 0, pb.reason or "released"
            self._reschedule(delivery, entry, now)

    def redelivered(self, delivery: Delivery, *, dead_lettered: bool = False) -> None:
        """The new copy (or dead letter) and its marker are on the broker: forget the delivery."""
        key = _key(*delivery)
        entry = self._inflight.get(key)
        if entry is not None:
            self._drop(key, entry)
            self.stats["dead_letters" if dead_lettered else "redeliveries"] += 1

    def discard(self, delivery: Delivery, why: str) -> None:
        """Forget a delivery that cannot be redelivered (its START is gone), counting ``why``."""
        key = _key(*delivery)
        entry = self._inflight.get(key)
        if entry is not None:
            self._drop(key, entry)
            self.stats[why] += 1

    def redelivery_failed(self, delivery: Delivery, now: float, retry_after_s: float) -> None:
        """The redelivery did not go through: try again after ``retry_after_s``."""
        self._retry(_key(*delivery), now + retry_after_s, "redelivery_failed")

    def postpone(self, delivery: Delivery, until: float) -> None:
        """Hold a due redelivery (its queue is paused) until ``until``."""
        self._retry(_key(*delivery), until, "postponed")

    # -- outputs ----------------------------------------------------------------------

    def due(self, now: float, limit: int = 1000) -> list[Redeliver]:
        """Redeliveries whose deadline has passed; none while replaying."""
        if self.replaying:
            return []
        actions: list[Redeliver] = []
        while self._deadlines and len(actions) < limit:
            entry = self._deadlines[0]
            if entry.deadline > now:
                break
            del self._deadlines[0]
            key = entry.key
            entry.redelivering = True
            action = Redeliver(
                marker_partition=self.partition,
                delivery=_delivery(key),
                queue="",
                message_id="",
                attempt=0,
                key=b"",
                value=b"",
                headers=(),
                reason=entry.reason,
                start_offset=entry.start_offset,
                attempt_step=entry.attempt_step,
            )
            actions.append(action if entry.start is None else complete(action, entry.start))
        return actions

    def next_deadline(self) -> float | None:
        return float(self._deadlines[0].deadline) if self._deadlines else None

    def commit_offset(self, settled: Iterable[int] = ()) -> int | None:
        """The offset a restart must replay from: the oldest in-flight START, else the end.

        ``settled``: START offsets, one per delivery, to count as finished already (for a
        commit that goes in the same transaction as their redelivery). Several STARTs can
        share one offset (a BATCH record), so they are counted, not just looked up.
        """
        pending = Counter(settled)
        for start in self._starts:
            if pending[start] > 0:
                pending[start] -= 1
                continue
            return int(start)
        return self.position

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def deliveries(self) -> list[Delivery]:
        return [_delivery(key) for key in self._inflight]

    # -- internals --------------------------------------------------------------------

    def _on_start(self, offset: int, pb: marker_pb2.Marker, delivery: int, now: float) -> None:
        if pb.attempt < 1:
            self.stats["bad_attempt"] += 1  # complete() counts it as attempt 1
        deadline = now + self._lease_s(pb.redeliver_after_ms)
        entry = self._inflight.get(delivery)
        if entry is not None:
            # The same record started twice: a consumer died between START and offset commit,
            # or a rebalance handed the record to a second consumer. One lease covers both.
            self.stats["duplicate_start"] += 1
            if not entry.redelivering:
                self._reschedule(delivery, entry, max(entry.deadline, deadline))
            return
        start = from_pb(pb) if self.keep_payloads else None
        entry = self._inflight[delivery] = _InFlight(delivery, deadline, offset, start)
        self._deadlines.add(entry)
        self._starts.add(offset)

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

    def _retry(self, delivery: int, deadline: float, why: str) -> None:
        entry = self._inflight.get(delivery)
        if entry is not None and entry.redelivering:
            entry.redelivering = False
            self.stats[why] += 1
            self._reschedule(delivery, entry, deadline)

    def _reschedule(self, delivery: int, entry: _InFlight, deadline: float) -> None:
        if not entry.redelivering:
            self._deadlines.discard(entry)
        entry.deadline = deadline
        self._deadlines.add(entry)

    def _drop(self, delivery: int, entry: _InFlight) -> None:
        del self._inflight[delivery]
        if not entry.redelivering:
            self._deadlines.discard(entry)
        self._starts.discard(entry.start_offset)
