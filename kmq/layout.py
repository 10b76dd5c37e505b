"""Where each logical queue's records live on a shared topic. Pure: no I/O.

A queue's records go to ``spread`` consecutive partitions (modulo the topic's partition
count) starting at ``crc32(queue id) mod partitions``, or, for a queue declared when the
topic was created, at the partition the layout places it at; its consumer group reads only
those, so a consumer no longer fetches and skips every other queue's records. Queues whose
windows overlap share a partition and still skip each other's records there: hashed windows
often do (16 queues of 4 partitions hashed over 64 leave each record read by two groups on
average), placed ones do not while the partitions suffice.

The layout of a topic is a record on the control topic (:class:`TopicLayout`), so every
producer, consumer and tracker agrees on it. A topic without one (created by kmq 0.1, or by
hand) keeps the 0.1 layout: every queue on every partition, every group reading all of them.
``legacy_end`` says how far records of that old layout may reach: ``None`` while they may
still be written (every group keeps reading every partition), else one end offset per
partition, read up to by every group and then dropped.
"""

from __future__ import annotations

import json
import zlib
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

LAYOUT_VERSION = 2
PLACED_VERSION = 3
"""A layout with placed queues (:attr:`TopicLayout.placed`)."""
MAX_SPREAD = 1024


@dataclass(frozen=True)
class TopicLayout:
    """The placement rule of one topic, as stored on the control topic."""

    partitions: int
    """The partition count queues are hashed over, pinned when the layout was written:
    adding partitions to the topic later does not move any queue."""
    spread: int = 1
    """Partitions per queue, unless ``queues`` says otherwise."""
    queues: Mapping[str, int] = field(default_factory=dict)
    """Per-queue spreads (hot queues). They may only grow: see :func:`grown`."""
    legacy_end: Mapping[int, int] | None = None
    """``None``: records of the old everywhere-layout may still appear on any partition.
    Else: they end before these offsets (a partition not listed holds none)."""
    placed: Mapping[str, int] = field(default_factory=dict)
    """Queues whose window starts at a partition given here rather than at their id's hash
    (declared when the topic was created, so that their windows overlap as little as the
    partitions allow: see :func:`place`). Fixed for the topic's life: moving a window
    would strand the records in the old one."""

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")
        for name, spread in (("*", self.spread), *self.queues.items()):
            if not 1 <= spread <= MAX_SPREAD:
                raise ValueError(f"spread of {name} must be within [1, {MAX_SPREAD}]")
        for name, base in self.placed.items():
            if not 0 <= base < self.partitions:
                raise ValueError(
                    f"queue {name!r} is placed at partition {base}, outside [0, {self.partitions})"
                )

    def spread_of(self, queue: str) -> int:
        return min(self.queues.get(queue, self.spread), self.partitions)


def base_partition(queue: str, partitions: int) -> int:
    """Where the window of a queue that was not placed starts."""
    return zlib.crc32(queue.encode()) % partitions


def place(partitions: int, spread: int, queues: Sequence[str]) -> dict[str, int]:
    """Window starts for ``queues`` (in this order), each of ``spread`` partitions out of
    ``partitions``, packed from partition 0 so that no two overlap while there is room;
    beyond that each goes where it shares the fewest partitions. Deterministic."""
    if partitions < 1 or spread < 1:
        raise ValueError(f"partitions and spread must be >= 1, got {partitions} and {spread}")
    width = min(spread, partitions)
    load = [0] * partitions
    placed: dict[str, int] = {}
    for queue in queues:
        if queue in placed:
            continue
        windows = _windows(load, width)
        best = min(range(partitions), key=lambda base: (*windows[base], base))
        for i in range(width):
            load[(best + i) % partitions] += 1
        placed[queue] = best
    return placed


def _windows(load: list[int], width: int) -> list[tuple[int, int]]:
    """(max, sum) of ``load`` over each window of ``width`` consecutive partitions
    (wrapping), by its first partition: O(partitions), so that placing many queues on many
    partitions stays quick. ``1 <= width <= len(load)``: the ring then holds exactly one
    window per partition."""
    ring = load + load[: width - 1]
    out: list[tuple[int, int]] = []
    total = sum(ring[:width])
    maxima: deque[int] = deque()  # indexes into ring, their loads decreasing
    for i, value in enumerate(ring):
        while maxima and ring[maxima[-1]] <= value:
            maxima.pop()
        maxima.append(i)
        start = i - width + 1
        if start < 0:
            continue
        if maxima[0] < start:
            maxima.popleft()
        if start > 0:
            total += value - ring[start - 1]
        out.append((ring[maxima[0]], total))
    return out


def write_partitions(layout: TopicLayout | None, queue: str, actual: int) -> tuple[int, ...]:
    """The partitions ``queue``'s records are written to; ``actual`` is the topic's
    partition count now. Without a layout: every partition (the 0.1 layout)."""
    if layout is None:
        return tuple(range(actual))
    modulus = min(layout.partitions, actual)
    placed = layout.placed.get(queue)
    base = base_partition(queue, modulus) if placed is None else placed % modulus
    return tuple((base + i) % modulus for i in range(min(layout.spread_of(queue), modulus)))


def read_partitions(layout: TopicLayout | None, queue: str, actual: int) -> dict[int, int | None]:
    """The partitions ``queue``'s group must read, each with the offset it may stop at
    (``None``: never). Its own partitions, plus every other one that may hold records of
    the old layout."""
    own = write_partitions(layout, queue, actual)
    wanted: dict[int, int | None] = dict.fromkeys(own)
    legacy = None if layout is None else layout.legacy_end
    for partition in range(actual):
        if partition in wanted:
            continue
        if legacy is None:
            wanted[partition] = None
        elif legacy.get(partition, 0) > 0:
            wanted[partition] = legacy[partition]
    return wanted


def mirrored(
    queue_window: Sequence[int], retry_window: Sequence[int], owned: Collection[int]
) -> set[int]:
    """The retry-lane partitions that go with the queue partitions ``owned``: the j-th
    partition of the retry window goes with the (j mod n)-th of the queue window (of n).
    A queue's consumer reads exactly these (:func:`retry_reads`), so the tracker knows
    which retry-lane partition a holder reads, and can send a copy elsewhere."""
    if not queue_window:
        return set()
    return {
        partition
        for j, partition in enumerate(retry_window)
        if queue_window[j % len(queue_window)] in owned
    }


def retry_reads(
    queue_window: Sequence[int],
    retry_window: Sequence[int],
    retry_read: Collection[int],
    owned: Collection[int],
) -> set[int]:
    """The retry-topic partitions read by the consumer that owns the queue partitions
    ``owned``: of ``retry_read`` (all the queue must read), those of the retry window that go
    with them (:func:`mirrored`), and of the others (records of the old layout) those whose
    number, modulo the queue window's size, picks an owned one. So while every partition of
    the queue window has an owner, every partition of ``retry_read`` has exactly one reader."""
    if not queue_window:
        return set()
    outside = set(retry_read) - set(retry_window)
    return (mirrored(queue_window, retry_window, owned) & set(retry_read)) | {
        partition for partition in outside if queue_window[partition % len(queue_window)] in owned
    }


def away_from_holder(
    queue_window: Sequence[int], retry_window: Sequence[int], read_from: int, lane_is_retry: bool
) -> int | None:
    """A retry-lane partition for a copy of a record read from ``read_from`` (a queue-topic
    partition, or with ``lane_is_retry`` a retry-topic one) that, by :func:`mirrored`, goes
    with another queue partition than the holder's: if the holder was killed, its own
    retry-lane partitions wait for the group to notice, but this one has a live reader
    whenever another consumer reads the queue. ``None`` if there is no such partition (a
    window of one) or ``read_from`` is outside its window."""
    window = retry_window if lane_is_retry else queue_window
    if read_from not in window or not queue_window:
        return None
    held = window.index(read_from) % len(queue_window)
    width = min(len(queue_window), len(retry_window))
    if width < 2:
        return None
    return retry_window[(held + 1) % width]


def holders_reads(
    queue_window: Sequence[int], retry_window: Sequence[int], read_from: int, lane_is_retry: bool
) -> set[int]:
    """The retry-lane partitions the holder of a record read from ``read_from`` reads too
    (by :func:`mirrored`, those that go with the queue partition it owns), as far as they
    can be told."""
    if not queue_window:
        return set()
    if not lane_is_retry:
        return mirrored(queue_window, retry_window, {read_from})
    if read_from not in retry_window:
        return {read_from}
    owned = queue_window[retry_window.index(read_from) % len(queue_window)]
    return mirrored(queue_window, retry_window, {owned}) | {read_from}


def toward_live_reader(
    queue_window: Sequence[int],
    retry_window: Sequence[int],
    read_from: int,
    lane_is_retry: bool,
    live: Collection[int],
    spread_by: int = 0,
) -> int | None:
    """A retry-lane partition for a copy of a record read from ``read_from`` that a consumer
    has lately said it reads (``live``) and that is not the holder's
    (:func:`holders_reads`): :func:`away_from_holder`'s choice if it is one of them, else
    one picked by ``spread_by`` (the record's offset, say). A live partition outside the
    retry window counts too: one a consumer that owns none of the queue's partitions reads
    as its spare (:func:`spare_candidates`). ``None`` if there is none: then nobody but the
    holder is known to read the queue's retry lane now."""
    candidates = sorted(live_elsewhere(queue_window, retry_window, read_from, lane_is_retry, live))
    if not candidates:
        return None
    away = away_from_holder(queue_window, retry_window, read_from, lane_is_retry)
    if away in candidates:
        return away
    return candidates[spread_by % len(candidates)]


def live_elsewhere(
    queue_window: Sequence[int],
    retry_window: Sequence[int],
    read_from: int,
    lane_is_retry: bool,
    live: Collection[int],
) -> set[int]:
    """Of ``live``, the retry-lane partitions someone other than the holder of a record read
    from ``read_from`` reads: where :func:`toward_live_reader` may send its copy."""
    return set(live) - holders_reads(queue_window, retry_window, read_from, lane_is_retry)


def spare_candidates(retry_partitions: int, retry_read: Collection[int]) -> list[int]:
    """The retry-topic partitions a queue's consumers may read as spares: those its own
    consumers do not read otherwise (outside ``retry_read``, :func:`read_partitions` on the
    retry topic). A member of the queue's group that owns none of its partitions (more
    consumers than the queue has partitions) is given one of them by the group's leader
    (:func:`kmq.assignor.assign_spares`) and says so on its marker records, so a tracker
    can send it copies while every owner of the queue's partitions is gone (killed at
    once), instead of to a partition nobody reads until the group has noticed."""
    return [p for p in range(retry_partitions) if p not in retry_read]


def grown(layout: TopicLayout, queue: str, spread: int) -> TopicLayout:
    """``layout`` with ``queue`` spread over ``spread`` partitions. A spread never shrinks:
    the partitions it would give up may still hold the queue's records."""
    current = layout.spread_of(queue)
    if spread < current:
        raise ValueError(
            f"queue {queue!r} is spread over {current} partitions; a spread can only grow"
        )
    return TopicLayout(
        layout.partitions,
        layout.spread,
        {**layout.queues, queue: spread},
        layout.legacy_end,
        layout.placed,
    )


def encode_layout(layout: TopicLayout) -> bytes:
    """A layout without placed queues keeps version 2, which kmq releases before placement
    read too; one with them is version 3, which those releases do not read."""
    doc: dict[str, object] = {
        "version": LAYOUT_VERSION,
        "partitions": layout.partitions,
        "spread": layout.spread,
        "queues": dict(layout.queues),
        "legacy_end": None
        if layout.legacy_end is None
        else {str(p): o for p, o in layout.legacy_end.items()},
    }
    if layout.placed:
        doc["version"] = PLACED_VERSION
        doc["placed"] = dict(layout.placed)
    return json.dumps(doc, sort_keys=True).encode()


def decode_layout(value: bytes | None) -> TopicLayout | None:
    """The layout in a control record, or ``None`` for a deletion or anything unreadable
    (then the topic is read as the old layout, which loses nothing)."""
    if not value:
        return None
    try:
        doc = json.loads(value)
        version = doc.get("version")
        if version not in (LAYOUT_VERSION, PLACED_VERSION):
            return None
        legacy = doc.get("legacy_end")
        placed = doc["placed"] if version == PLACED_VERSION else {}
        return TopicLayout(
            partitions=_int(doc["partitions"]),
            spread=_int(doc.get("spread", 1)),
            queues={str(q): _int(s) for q, s in (doc.get("queues") or {}).items()},
            legacy_end=None
            if legacy is None
            else {_int(int(p)): _int(o) for p, o in legacy.items()},
            placed={str(q): _int(b) for q, b in placed.items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a non-negative integer: {value!r}")
    return value
