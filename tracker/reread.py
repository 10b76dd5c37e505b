"""Re-reading the records that due deliveries name, so the tracker can copy them.

The tracker keeps no payloads: a START names its record by lane (queue or retry topic),
partition and offset, and a redelivery reads that record again. Deliveries due in one round
usually lie close together, so each partition is read forward once per cluster of nearby
offsets, parsing only the records wanted (:mod:`tracker.sparse_fetch`). A scan has a time
budget: what it found by then is redelivered, what it did not reach waits a round. A record
is gone when the reader's position moves past it (read past, skipped as an aborted
transaction's record, or a reset past the log start after retention), or when two scans in a
row, each with a partition state of its own, found the partition ending before it (a START
naming a record that never existed). A high watermark the reader learnt before its seek
proves nothing: it may be older than the record, and every record a real START names existed
when the START was written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafka import TopicPartition

from kmq.records import split_key
from tracker import sparse_fetch
from tracker.state import Due

log = logging.getLogger("kmq.tracker")

SCAN_TIMEOUT_S = 5.0
"""How long one re-read scan may take; what it has not reached by then waits a round."""
SCAN_RECORDS = 500
"""Records per poll of a re-read scan."""
SCAN_GAP = 5000
"""Offsets further apart than this are fetched by separate seeks, not one scan."""
_MAX_PAST_END = 100_000


class _Reader(Protocol):
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def seek(self, partition: TopicPartition, offset: int) -> None: ...
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> Any: ...
    def highwater(self, partition: TopicPartition) -> int | None: ...
    def position(self, partition: TopicPartition) -> int: ...


@dataclass(frozen=True, slots=True)
class Record:
    """What a redelivery needs of a record."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass
class ReadResult:
    found: dict[int, Record] = field(default_factory=dict)
    """By delivery key."""
    gone: list[Due] = field(default_factory=list)
    """Read past without finding them (deleted by retention, or an aborted transaction's
    record), or past the partition's end twice."""
    waiting: list[Due] = field(default_factory=list)
    """Not reached in time: try again next round."""


def clusters(offsets: list[int], gap: int = SCAN_GAP) -> list[list[int]]:
    """Sorted offsets cut wherever two are more than ``gap`` apart."""
    ordered = sorted(set(offsets))
    out: list[list[int]] = [[ordered[0]]] if ordered else []
    for offset in ordered[1:]:
        if offset - out[-1][-1] > gap:
            out.append([])
        out[-1].append(offset)
    return out


class RecordReader:
    """Reads records back by (lane, partition, offset) with a consumer of its own."""

    def __init__(
        self, reader: _Reader, topics: Mapping[int, str], *, scan_timeout_s: float = SCAN_TIMEOUT_S
    ) -> None:
        self._reader = reader
        self._topics = topics
        self._scan_timeout_s = scan_timeout_s
        self._past_end: set[int] = set()
        """Delivery keys a scan found beyond the partition's end once."""
        self._wanted: dict[TopicPartition, frozenset[int]] = {}
        # The reader then parses only these offsets of the records it fetches.
        sparse_fetch.install(reader, self._wanted)

    def read(self, wanted: list[Due]) -> ReadResult:
        result = ReadResult()
        by_partition: dict[tuple[int, int], dict[int, list[Due]]] = {}
        for due in wanted:
            lane, partition, offset = split_key(due.key)
            by_partition.setdefault((lane, partition), {}).setdefault(offset, []).append(due)
        deadline = time.monotonic() + self._scan_timeout_s
        for (lane, partition), by_offset in by_partition.items():
            topic = self._topics.get(lane)
            if topic is None:
                result.gone.extend(d for dues in by_offset.values() for d in dues)
                continue
            tp = TopicPartition(topic, partition)
            for cluster in clusters(list(by_offset)):
                found, reached, end = self._scan(tp, cluster, deadline)
                for offset in cluster:
                    for due in by_offset[offset]:
                        record = found.get(offset)
                        if record is not None:
                            self._past_end.discard(due.key)
                            result.found[due.key] = record
                            continue
                        past_end = end is not None and offset >= end
                        if offset < reached or (past_end and due.key in self._past_end):
                            self._past_end.discard(due.key)
                            result.gone.append(due)
                        else:
                            if past_end:
                                self._past_end.add(due.key)
                            result.waiting.append(due)
        if len(self._past_end) > _MAX_PAST_END:  # keys of deliveries settled meanwhile
            self._past_end.clear()
        return result

    def _scan(
        self, tp: TopicPartition, offsets: list[int], deadline: float
    ) -> tuple[dict[int, Record], int, int | None]:
        """Records at ``offsets`` (sorted) found by reading forward from the first; the
        offset the reader's position reached; the partition's end, if the scan got there."""
        wanted = frozenset(offsets)
        first, last = offsets[0], offsets[-1]
        reader = self._reader
        self._wanted.clear()
        self._wanted[tp] = wanted
        # A partition state of this scan's own: the high watermark it learns is then from a
        # fetch after this seek, not one from an earlier scan.
        reader.assign([])
        reader.assign([tp])
        reader.seek(tp, first)
        found: dict[int, Record] = {}
        reached = first
        while True:  # at least one poll, however late: every round makes progress
            records = reader.poll(timeout_ms=200, max_records=SCAN_RECORDS).get(tp, [])
            for r in records:
                if r.offset in wanted:
                    found[r.offset] = Record(
                        r.partition, r.offset, r.key, r.value, tuple(r.headers or ())
                    )
                reached = r.offset + 1
                if r.offset >= last:
                    return found, reached, None
            if not records:
                # Skipped aborted records, or reset past the log start: the position moved.
                position = reader.position(tp)
                reached = max(reached, position)
                if reached > last:
                    return found, reached, None
                highwater = reader.highwater(tp)
                if highwater is not None and position >= highwater:
                    return found, reached, highwater
            if time.monotonic() >= deadline:
                return found, reached, None
