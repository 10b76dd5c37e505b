"""Batching markers: one record per markers partition per flush, instead of one per marker."""

from __future__ import annotations

import logging
import zlib
from typing import Any

from kafka import KafkaProducer

from kmq.markers import Marker, encode_batch

log = logging.getLogger(__name__)

_MARKER_OVERHEAD_BYTES = 128


def marker_partition(message_id: str, partitions: int) -> int:
    """The markers partition every marker of ``message_id`` goes to."""
    return zlib.crc32(message_id.encode()) % partitions


class MarkerWriter:
    """Collects markers per markers partition; :meth:`flush` writes each partition's markers,
    in the order they were added, as one BATCH record (or a few, to stay under the size
    limit). Not thread-safe: the consumer calls it under its own lock, which is what keeps
    the markers of one message in the order they were decided."""

    def __init__(self, topic: str, partitions: int, max_record_bytes: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self._budget = max(1, max_record_bytes // 2)
        self._pending: dict[int, list[Marker]] = {}
        self.pending = 0

    def partition_for(self, message_id: str) -> int:
        return marker_partition(message_id, self.partitions)

    def add(self, marker: Marker, partition: int) -> None:
        self._pending.setdefault(partition, []).append(marker)
        self.pending += 1

    def flush(self, producer: KafkaProducer) -> dict[int, list[Any]]:
        """Send everything pending; the futures of each partition's records, in order."""
        futures: dict[int, list[Any]] = {}
        # Taken out first: a send that raises (a marker over the size limit) must not leave
        # its markers behind to fail every later flush. What it did not send is logged; the
        # caller re-reads STARTs, and any other marker lost only costs a redelivery.
        pending, self._pending = self._pending, {}
        unsent, self.pending = self.pending, 0
        try:
            for partition, markers in pending.items():
                for chunk in self._chunks(markers):
                    key = chunk[0].message_id.encode() if len(chunk) == 1 else None
                    future = producer.send(
                        self.topic, key=key, value=encode_batch(chunk), partition=partition
                    )
                    unsent -= len(chunk)
                    future.add_errback(_log_lost, len(chunk), partition)
                    futures.setdefault(partition, []).append(future)
        except Exception as exc:
            log.error(
                "%d markers not written (%r): a START is read again; a message whose other "
                "marker was lost is redelivered when its lease runs out",
                unsent, exc,
            )  # fmt: skip
            raise
        return futures

    def _chunks(self, markers: list[Marker]) -> list[list[Marker]]:
        chunks: list[list[Marker]] = [[]]
        size = 0
        for marker in markers:
            cost = (
                len(marker.value)
                + len(marker.key)
                + sum(len(k) + len(v) for k, v in marker.headers)
                + _MARKER_OVERHEAD_BYTES
            )
            if chunks[-1] and size + cost > self._budget:
                chunks.append([])
                size = 0
            chunks[-1].append(marker)
            size += cost
        return chunks


def _log_lost(exc: BaseException, count: int, partition: int) -> None:
    log.error(
        "%d markers for markers partition %d not written (%r); their messages will be "
        "redelivered when their leases run out",
        count, partition, exc,
    )  # fmt: skip
