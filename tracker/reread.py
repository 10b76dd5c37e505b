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
FETCH_WAIT_MS = 500
"""The re-read consumer's ``fetch_max_wait_ms``. A re-read fetches records that exist, so on
Kafka it never waits. The embedded broker (Tansu 510f3e2, ``DynoStore::fetch``) lists a
partition's stored batches from the first and stops listing once the fetch's wait has run
out, answering with nothing if the list had not reached the fetch offset; the client fetches
again at once, and the broker lists again. On a long partition of small batches beside busy
processes a short wait is then a loop of empty fetches, each spending the broker's CPU on a
listing: 500 offsets from the end of 120,000 one-record batches came back empty every time
at 10 and 25 ms, 2 in 10 at 50. Full chaos run 49 (this setting) had no copy late for a
slow tracker; runs 50 and 55 (50 ms) had 55 and 733. The cost, and why it was reverted once
(11a5e2c): a fetch that kafka-python sends ahead at a partition's end waits out the wait
there and holds up the next scan's fetch to that broker; on short partitions the
redelivery benchmark's 10 %-dropped p99 is about 100 ms worse for it (README,
Performance)."""
FETCH_MAX_BYTES = 256 * 1024
"""The re-read consumer's fetch size (total and per partition). The embedded broker reads a
fetch's batches from its offset up to the request's byte limit (5 MB at most), while a scan
wants a few records near the offset it seeks to. Kafka answers with a first batch larger
than this whole, and so does the embedded broker (a 300 KB record was re-read with 64 KB
limits)."""


class _Reader(Protocol):
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def seek(self, partition: TopicPartition, offset: int) -> None: ...
    def pause(self, *partitions: TopicPartition) -> None: ...
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
        by_partition: dict[TopicPartition, dict[int, list[Due]]] = {}
        for due in wanted:
            lane, partition, offset = split_key(due.key)
            topic = self._topics.get(lane)
            if topic is None:
                result.gone.append(due)
                continue
            tp = TopicPartition(topic, partition)
            by_partition.setdefault(tp, {}).setdefault(offset, []).append(due)
        # Pass n scans the n-th cluster of every partition at once: one fetch request (per
        # broker) serves them all, where a scan per partition cost a round trip each, and
        # with a dozen partitions due that was most of a round on a loaded machine.
        passes: list[dict[TopicPartition, list[int]]] = []
        for tp, by_offset in by_partition.items():
            for n, cluster in enumerate(clusters(list(by_offset))):
                if len(passes) <= n:
                    passes.append({})
                passes[n][tp] = cluster
        deadline = time.monotonic() + self._scan_timeout_s
        for scans in passes:
            for tp, (found, reached, end) in self._scan(scans, deadline).items():
                for offset in scans[tp]:
                    for due in by_partition[tp][offset]:
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
        self, scans: Mapping[TopicPartition, list[int]], deadline: float
    ) -> dict[TopicPartition, tuple[dict[int, Record], int, int | None]]:
        """For each partition, the records at its ``offsets`` (sorted) found by reading
        forward from the first; the offset the reader's position reached; the partition's
        end, if the scan got there. All partitions are read together."""
        reader = self._reader
        self._wanted.clear()
        for tp, offsets in scans.items():
            self._wanted[tp] = frozenset(offsets)
        # A partition state of this scan's own: the high watermark it learns is then from a
        # fetch after this seek, not one from an earlier scan.
        reader.assign([])
        reader.assign(list(scans))
        for tp, offsets in scans.items():
            reader.seek(tp, offsets[0])
        found: dict[TopicPartition, dict[int, Record]] = {tp: {} for tp in scans}
        reached = {tp: offsets[0] for tp, offsets in scans.items()}
        done: dict[TopicPartition, tuple[dict[int, Record], int, int | None]] = {}
        while True:  # at least one poll, however late: every round makes progress
            polled = reader.poll(timeout_ms=200, max_records=SCAN_RECORDS)
            for tp, offsets in scans.items():
                if tp in done:
                    continue
                over, end = self._take(tp, offsets, polled.get(tp, []), found[tp], reached)
                if over:
                    done[tp] = (found[tp], reached[tp], end)
                    reader.pause(tp)  # the others' scans go on without it
            if len(done) == len(scans):
                return done
            if time.monotonic() >= deadline:
                return {tp: done.get(tp, (found[tp], reached[tp], None)) for tp in scans}

    def _take(
        self,
        tp: TopicPartition,
        offsets: list[int],
        records: list[Any],
        found: dict[int, Record],
        reached: dict[TopicPartition, int],
    ) -> tuple[bool, int | None]:
        """Note one poll's ``records`` of ``tp``: (whether its scan is over, the partition's
        end if the scan got there)."""
        wanted = self._wanted[tp]
        last = offsets[-1]
        for r in records:
            if r.offset in wanted:
                found[r.offset] = Record(
                    r.partition, r.offset, r.key, r.value, tuple(r.headers or ())
                )
            reached[tp] = r.offset + 1
            if r.offset >= last:
                return True, None
        if records:
            return False, None
        # Skipped aborted records, or reset past the log start: the position moved.
        position = self._reader.position(tp)
        reached[tp] = max(reached[tp], position)
        if reached[tp] > last:
            return True, None
        highwater = self._reader.highwater(tp)
        if highwater is not None and position >= highwater:
            return True, highwater
        return False, None
