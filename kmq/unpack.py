"""kafka-python's fetched partition data, with the record parsing replaced by kmq.record_v2.

kafka-python's fetcher unpacks each fetched partition through its ``PartitionRecords``
class: the batch-level work (CRC checks, aborted transactions, control batches, positions),
then a ``DefaultRecord`` and a ``ConsumerRecord`` per record, which costs a consumer more than
the rest of a fetch (about 4-8 µs a record on the bench machine, against about 1.5).
:class:`Records` keeps the batch-level work as kafka-python 3.0 (pinned) does it and reads a
message format v2 batch's records with :func:`kmq.record_v2.records`: ``poll()`` returns the
same ConsumerRecords. Subclasses choose the records wanted (the tracker's re-read) or hand over
whole batches (the Spark Data Source). Every consumer kmq builds gets it
(:mod:`kmq.kafka_clients`); one without kafka-python's hook (a stub) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from typing import Any, Protocol

from kafka.consumer.fetcher import ConsumerRecord, Fetcher
from kafka.errors import CorruptRecordError
from kafka.protocol.consumer.offsets import IsolationLevel

from kmq.record_v2 import records as v2_records

_READ_COMMITTED = IsolationLevel.READ_COMMITTED


class Wanted(Protocol):
    """Which offsets of one partition to return (the rest are stepped over unparsed)."""

    def now(self) -> Container[int] | None:
        """The offsets wanted now (``None``: every one). Asked again after each record."""

    def any_between(self, first: int, last: int) -> bool:
        """Whether an offset from ``first`` to ``last`` is wanted now."""

    def last(self) -> int | None:
        """The highest offset wanted now (``None``: every one, or none)."""


def install(consumer: Any, records: type[Records] | None = None) -> bool:
    """Make ``consumer``'s fetcher unpack with ``records`` (default :class:`Records`). False:
    the consumer has no such hook (a stub), and nothing changed."""
    fetcher: Any = getattr(consumer, "_fetcher", None)
    if not isinstance(getattr(fetcher, "PartitionRecords", None), type):
        return False
    fetcher.PartitionRecords = records or Records
    return True


class Records(Fetcher.PartitionRecords):  # type: ignore[misc]
    """kafka-python's ``PartitionRecords`` reading v2 records with :mod:`kmq.record_v2`."""

    wanted: Wanted | None = None
    """None here: every record. Set per partition by a subclass."""

    def _unpack_records(
        self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
    ) -> Iterator[Any]:
        # The batch loop of kafka-python's PartitionRecords._unpack_records, unchanged in
        # what it checks, skips and where it leaves the position.
        wanted = self.wanted
        batch = records.next_batch()
        last_batch = None
        while batch is not None:
            if wanted is not None and batch.magic == 2 and self._past_wanted(wanted, batch):
                # Nothing further is wanted: leave the rest of the fetch unread. A fetch
                # brings up to its byte limit per partition (the embedded broker gives the
                # first partition with data 5 MB by default), and with a record per batch (a
                # slow producer) stepping over the batches past the last wanted offset took
                # 90% of the tracker's re-read in a profile.
                self.next_fetch_offset = batch.base_offset
                self.drain()
                return
            last_batch = batch
            if self.check_crcs and not batch.validate_crc():
                raise CorruptRecordError(
                    f"Record batch for partition {tp} at offset {batch.base_offset} "
                    "failed crc check"
                )
            if batch.magic == 2:
                self.leader_epoch = batch.leader_epoch
                if self.isolation_level == _READ_COMMITTED and batch.has_producer_id():
                    self._consume_aborted_transactions_up_to(batch.last_offset)
                    if self._contains_abort_marker(batch):
                        self.aborted_producer_ids.discard(batch.producer_id)
                    elif self._is_batch_aborted(batch):
                        self.next_fetch_offset = batch.next_offset
                        batch = records.next_batch()
                        continue
                if batch.is_control_batch:
                    self.next_fetch_offset = batch.next_offset
                    batch = records.next_batch()
                    continue
                yield from self._batch(tp, batch, key_deserializer, value_deserializer)
            else:
                yield from self._legacy(tp, batch, key_deserializer, value_deserializer)
            batch = records.next_batch()
        if last_batch is not None and last_batch.magic == 2:
            self.next_fetch_offset = last_batch.next_offset
        self.drain()

    def _past_wanted(self, wanted: Wanted, batch: Any) -> bool:
        """Whether ``batch`` starts past every offset wanted, and past the fetch offset (so
        that stopping there still moves the position on)."""
        last = wanted.last()
        return last is not None and batch.base_offset > max(last, self.fetch_offset)

    def _batch(
        self, tp: Any, batch: Any, key_deserializer: Any, value_deserializer: Any
    ) -> Iterator[Any]:
        """The records of a v2 data batch, as ConsumerRecords."""
        wanted = self.wanted
        now: Callable[[], Container[int] | None] | None = None
        if wanted is not None:
            if not wanted.any_between(batch.base_offset, batch.last_offset):
                return
            now = wanted.now
        self.bytes_read += batch.size_in_bytes  # kafka-python counts record by record
        topic, partition, epoch = tp.topic, tp.partition, self.leader_epoch
        ts_type = batch.timestamp_type
        plain = key_deserializer is None and value_deserializer is None
        new = tuple.__new__  # ConsumerRecord's own __new__ costs a Python call per record
        for offset, timestamp, key, value, headers in v2_records(batch, now):
            self.records_read += 1
            self.next_fetch_offset = offset + 1
            key_size = len(key) if key is not None else -1
            value_size = len(value) if value is not None else -1
            if not plain:
                key = self._deserialize(key_deserializer, topic, headers, key)
                value = self._deserialize(value_deserializer, topic, headers, value)
            yield new(ConsumerRecord, (
                topic, partition, epoch, offset, timestamp, ts_type, key, value, headers,
                None, key_size, value_size, _header_size(headers),
            ))  # fmt: skip

    def _legacy(
        self, tp: Any, batch: Any, key_deserializer: Any, value_deserializer: Any
    ) -> Iterator[Any]:
        """The records of a message format v0/v1 batch, as kafka-python unpacks them."""
        for record in batch:
            if self.check_crcs and not record.validate_crc():
                raise CorruptRecordError(
                    f"Record for partition {tp} at offset {record.offset} failed crc check"
                )
            key_size = len(record.key) if record.key is not None else -1
            value_size = len(record.value) if record.value is not None else -1
            key = self._deserialize(key_deserializer, tp.topic, record.headers, record.key)
            value = self._deserialize(value_deserializer, tp.topic, record.headers, record.value)
            self.records_read += 1
            self.bytes_read += record.size_in_bytes
            self.next_fetch_offset = record.offset + 1
            yield ConsumerRecord(
                tp.topic, tp.partition, self.leader_epoch, record.offset, record.timestamp,
                record.timestamp_type, key, value, record.headers, record.checksum,
                key_size, value_size, _header_size(record.headers),
            )  # fmt: skip


def _header_size(headers: list[tuple[str, bytes | None]]) -> int:
    """kafka-python's ``serialized_header_size``: -1 without headers."""
    if not headers:
        return -1
    size = 0  # a loop, not sum() over a generator: this runs for every record
    for name, data in headers:
        size += len(name.encode()) + (len(data) if data is not None else 0)
    return size
