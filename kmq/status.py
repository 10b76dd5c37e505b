"""``kmq status``, the pure part: what a status report holds, how open deliveries are paired
from markers, how counts are made from offsets and scanned records, and how a report is
printed. No I/O: :mod:`kmq.status_read` reads the cluster.

Open deliveries come from the markers: the tracker commits a markers partition only up to
its earliest open START (:meth:`tracker.state.PartitionState.commit_offset`), so replaying
each partition from the tracker group's committed offset to its end and pairing each START
with its END, REDELIVERED or DEAD_LETTERED finds every delivery still open. A NACKed,
RELEASEd or REJECTed delivery stays open until the tracker's copy (or dead letter) is out.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kmq.errors import MarkerDecodeError
from kmq.markers import MarkerType, decode_all

_SETTLED = frozenset({MarkerType.END, MarkerType.REDELIVERED, MarkerType.DEAD_LETTERED})

Delivery = tuple[int, int, int]
"""A delivered record: (lane, partition, offset)."""


@dataclass(frozen=True)
class QueueStatus:
    """One logical queue."""

    queue: str
    partitions: tuple[int, ...]
    """Queue-topic partitions its records are written to."""
    backlog_records: int
    """Records on its queue and retry partitions that its groups have not consumed."""
    in_flight: int
    """Deliveries taken by a consumer and not yet acked, redelivered or dead-lettered."""
    oldest_in_flight_age_s: float | None
    """Age of the oldest open delivery's START (by its record timestamp): a hint."""
    redeliveries: int
    """Copies the tracker has written for it, still on the retry topic."""
    dead_letters: int
    """Records of its dead-letter queue that no consumer of that queue has taken yet."""
    dead_letter_queue: str
    paused_until_ms: int
    """Epoch ms when its pause ends; 0 when not paused."""
    exact: bool = True
    """False when a scan was cut short: the counts are then upper bounds."""


@dataclass(frozen=True)
class TrackerMember:
    """One replica of the tracker group."""

    member_id: str
    client_id: str
    host: str
    partitions: tuple[int, ...] | None
    """Markers partitions it owns; ``None`` when the broker does not say (Tansu)."""


@dataclass(frozen=True)
class TrackerGroup:
    group_id: str
    state: str
    members: tuple[TrackerMember, ...]
    committed_offsets: dict[int, int]
    """Markers partition -> the group's committed offset."""


@dataclass(frozen=True)
class Status:
    taken_at_ms: int
    """Wall clock, epoch ms."""
    queue_topic: str
    queues: tuple[QueueStatus, ...]
    tracker: TrackerGroup
    unattributed_in_flight: int = 0
    """Open deliveries whose record could not be read to learn its queue."""
    notes: tuple[str, ...] = ()
    """What was cut short or could not be read."""


@dataclass(frozen=True)
class OpenDelivery:
    lane: int
    partition: int
    offset: int
    marker_partition: int
    start_ms: int
    """The START record's timestamp (the consumer's clock)."""
    queue: str = ""
    """Version 1 markers name their queue; version 2 leave it to the record."""


class OpenDeliveries:
    """Pairs the markers of a replay into the deliveries still open. Pure: no I/O."""

    def __init__(self) -> None:
        self._open: dict[Delivery, OpenDelivery] = {}
        self.bad_records = 0

    def apply(self, marker_partition: int, timestamp_ms: int, value: bytes | None) -> None:
        """One markers record, in offset order per markers partition."""
        try:
            markers = decode_all(value)
        except MarkerDecodeError:
            self.bad_records += 1
            return
        for marker in markers:
            key = (marker.lane, marker.partition, marker.offset)
            if marker.type is MarkerType.START:
                if key not in self._open:  # a second START shares the first's lease
                    self._open[key] = OpenDelivery(
                        marker.lane,
                        marker.partition,
                        marker.offset,
                        marker_partition,
                        timestamp_ms,
                        marker.queue,
                    )
            elif marker.type in _SETTLED:
                self._open.pop(key, None)  # unknown: its START lies before the commit point

    def open(self) -> list[OpenDelivery]:
        return list(self._open.values())


def assigned_partitions(assignment: object, topic: str) -> tuple[int, ...] | None:
    """A group member's partitions of ``topic``, from kafka-python's description of its
    assignment; ``None`` when the broker sent none (the embedded Tansu never does)."""
    if not isinstance(assignment, dict):
        return None
    found: list[int] = []
    for entry in assignment.get("assigned_partitions") or ():
        if isinstance(entry, dict) and entry.get("topic") == topic:
            found.extend(int(p) for p in entry.get("partitions") or ())
    return tuple(sorted(found))


def count_in_range(matched: int, start: int, end: int, read_to: int) -> tuple[int, bool]:
    """A queue's records in ``[start, end)`` of one partition, given ``matched`` of them
    found in the part read (up to ``read_to``): what was not read counts whole, as an upper
    bound. Returns the count and whether it is exact."""
    rest = max(0, end - max(start, read_to))
    return matched + rest, rest == 0


def in_flight_of(
    opened: Iterable[OpenDelivery], queue_of: dict[Delivery, str], queue: str, now_ms: int
) -> tuple[int, float | None]:
    """How many open deliveries are ``queue``'s, and the age of the oldest in seconds."""
    starts = [
        d.start_ms
        for d in opened
        if (d.queue or queue_of.get((d.lane, d.partition, d.offset))) == queue
    ]
    if not starts:
        return 0, None
    return len(starts), max(0.0, (now_ms - min(starts)) / 1000)


def to_json(status: Status) -> str:
    return json.dumps(dataclasses.asdict(status), indent=2, sort_keys=True)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _until(until_ms: int) -> str:
    if not until_ms:
        return "-"
    when = datetime.datetime.fromtimestamp(until_ms / 1000, datetime.UTC)
    return when.isoformat(timespec="seconds")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = []
    for row in (header, *rows):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
    return lines


def render(status: Status) -> str:
    """The terminal table; ``<=`` marks an upper bound (a scan cut short)."""
    header = ("QUEUE", "BACKLOG", "IN FLIGHT", "OLDEST", "REDELIVERED", "DEAD LETTERS",
              "PAUSED UNTIL")  # fmt: skip
    rows = []
    for q in status.queues:
        bound = "" if q.exact else "<="
        rows.append(
            (
                q.queue,
                f"{bound}{q.backlog_records}",
                str(q.in_flight),
                _age(q.oldest_in_flight_age_s),
                f"{bound}{q.redeliveries}",
                f"{bound}{q.dead_letters}",
                _until(q.paused_until_ms),
            )
        )
    taken = datetime.datetime.fromtimestamp(status.taken_at_ms / 1000, datetime.UTC)
    lines = [f"kmq status of {status.queue_topic} at {taken.isoformat(timespec='seconds')}", ""]
    lines += _table(header, rows) if rows else ["no queues found"]
    if status.unattributed_in_flight:
        lines.append(f"{status.unattributed_in_flight} open deliveries of unknown queue")
    tracker = status.tracker
    replicas = f"{len(tracker.members)} replica{'' if len(tracker.members) == 1 else 's'}"
    lines += ["", f"tracker group {tracker.group_id} ({tracker.state}): {replicas}"]
    for m in tracker.members:
        owned = "?" if m.partitions is None else ", ".join(map(str, m.partitions)) or "none"
        lines.append(f"  {m.member_id}  {m.client_id or '-'}  {m.host or '-'}  partitions {owned}")
    lines += [f"note: {n}" for n in status.notes]
    return "\n".join(lines)
