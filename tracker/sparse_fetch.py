"""A re-read consumer that parses only the records it was asked for.

The tracker re-reads due records to copy them, and the records between them come along in
the same fetched batches: with one record in ten due, kafka-python parsed ten records (about
6.4 µs each on the bench machine) and built ten ConsumerRecords for every copy, and the
re-read took half of the tracker's time in the benchmark's 10 %-dropped run. :func:`install`
gives a consumer's fetcher a record iterator that reads each record's length and offset
delta (about 0.6 µs) and parses only the offsets in ``wanted``.

Everything around the records stays kafka-python's: aborted-transaction filtering, control
batches, CRC checks of whole batches, positions (a batch read to its end moves the position
past the records skipped in it). Compressed batches are parsed in full, then filtered. The
record layout is the Kafka protocol's (message format v2); the hook is the fetcher's
``PartitionRecords`` class and a batch's raw buffer, both of kafka-python 3.0 (pinned), and
without them :func:`install` does nothing: the re-read then parses every record, as before.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecord, DefaultRecordBatch
from kafka.record.util import decode_varint

_RECORDS_AT = DefaultRecordBatch.HEADER_STRUCT.size
"""Where an uncompressed batch's first record starts in its buffer."""


def install(consumer: Any, wanted: Mapping[Any, Collection[int]]) -> bool:
    """Make ``consumer`` return, for a partition in ``wanted``, only the records at the
    offsets it lists (other partitions: all). ``wanted`` is read, never written, and read
    again whenever unpacking goes on: kafka-python keeps a partition's unpacked records
    across a re-assignment and hands them out if the new position matches, so records
    unpacked during one scan may be returned in the next, which wants other offsets. A
    partition's offsets are replaced, not changed in place (a frozenset, say). False: this
    consumer has no such hook (a stub)."""
    fetcher: Any = getattr(consumer, "_fetcher", None)
    base = getattr(fetcher, "PartitionRecords", None)
    if not isinstance(base, type):
        return False

    class SparsePartitionRecords(base):  # type: ignore[misc, valid-type]
        def __init__(self, fetch_offset: int, tp: Any, records: Any, *args: Any, **kw: Any):
            records = _SparseRecords(records, _Wanted(wanted, tp))
            super().__init__(fetch_offset, tp, records, *args, **kw)

    fetcher.PartitionRecords = SparsePartitionRecords
    return True


class _Wanted:
    """The offsets of one partition wanted now (``None``: every record)."""

    __slots__ = ("_frozen", "_last", "_sorted", "_tp", "_wanted")

    def __init__(self, wanted: Mapping[Any, Collection[int]], tp: Any) -> None:
        self._wanted = wanted
        self._tp = tp
        self._last: Collection[int] | None = None
        self._frozen: frozenset[int] = frozenset()
        self._sorted: list[int] = []

    def now(self) -> frozenset[int] | None:
        offsets = self._wanted.get(self._tp)
        if offsets is None:
            return None
        if offsets is not self._last:
            self._last = offsets
            self._frozen = frozenset(offsets)
            self._sorted = sorted(self._frozen)
        return self._frozen

    def any_between(self, first: int, last: int) -> bool:
        """Whether an offset from ``first`` to ``last`` is wanted now (or every one is)."""
        if self.now() is None:
            return True
        i = bisect_left(self._sorted, first)
        return i < len(self._sorted) and self._sorted[i] <= last


class _SparseRecords:
    """A fetch response's MemoryRecords whose data batches yield only the wanted records."""

    def __init__(self, records: Any, wanted: _Wanted) -> None:
        self._records = records
        self._wanted = wanted

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if not isinstance(batch, DefaultRecordBatch) or batch.is_control_batch:
            return batch  # the fetcher reads a control batch's record itself (next(batch))
        first = batch.base_offset
        if not self._wanted.any_between(first, first + batch.last_offset_delta):
            return _Skipped(batch)
        if batch.compression_type == DefaultRecordBatch.CODEC_NONE:
            return _SparseBatch(batch, self._wanted)
        return _FilteredBatch(batch, self._wanted)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)


class _Skipped:
    """A batch none of whose records is wanted: not parsed at all (the fetcher has checked
    its CRC). Its records are never yielded, so it is stepped over within one unpacking."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)


class _FilteredBatch(_Skipped):
    """A compressed batch, parsed in full, of which only the wanted records are yielded."""

    def __init__(self, batch: Any, wanted: _Wanted) -> None:
        super().__init__(batch)
        self._wanted = wanted

    def __iter__(self) -> Iterator[Any]:
        return self._filter(self._batch, self._wanted)

    @staticmethod
    def _filter(batch: Any, wanted: _Wanted) -> Iterator[Any]:
        offsets = wanted.now()
        for record in batch:
            if offsets is None or record.offset in offsets:
                yield record
                offsets = wanted.now()  # resumed: perhaps for a later scan


class _SparseBatch(_FilteredBatch):
    """An uncompressed batch: records not wanted are stepped over by their length."""

    def __iter__(self) -> Iterator[Any]:
        return self._walk(self._batch, self._wanted)

    @staticmethod
    def _walk(batch: DefaultRecordBatch, wanted: _Wanted) -> Iterator[Any]:
        offsets = wanted.now()
        buffer = batch._buffer
        end = len(buffer)
        pos = _RECORDS_AT
        base = batch.base_offset
        log_append = batch.timestamp_type == DefaultRecordBatch.LOG_APPEND_TIME
        for _ in range(batch.records_count):
            try:
                length, body = decode_varint(buffer, pos)
                at = body + 1  # attributes: an int8
                byte = buffer[at]
                if byte < 0x80:  # a varint of one byte (zigzag), as most time deltas are
                    ts_delta, at = (byte >> 1) ^ -(byte & 1), at + 1
                else:
                    ts_delta, at = decode_varint(buffer, at)
                byte = buffer[at]
                if byte < 0x80:
                    offset_delta, at = (byte >> 1) ^ -(byte & 1), at + 1
                else:
                    offset_delta, at = decode_varint(buffer, at)
            except (ValueError, IndexError) as exc:
                raise CorruptRecordError(f"Found invalid record structure: {exc!r}") from exc
            pos = body + length
            if length < 0 or pos > end:
                raise CorruptRecordError(f"Invalid record size {length} at offset delta "
                                         f"{offset_delta}")  # fmt: skip
            offset = base + offset_delta
            if offsets is not None and offset not in offsets:
                continue
            timestamp = batch.max_timestamp if log_append else batch.first_timestamp + ts_delta
            key, value, headers = _body(buffer, at, pos)
            yield DefaultRecord(
                length, offset, timestamp, batch.timestamp_type, key, value, headers
            )
            offsets = wanted.now()  # resumed: perhaps for a later scan
        if pos != end:
            raise CorruptRecordError(f"{end - pos} unconsumed bytes after all records consumed")


def _body(
    buffer: bytearray, pos: int, end: int
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """A record's key, value and headers, which run from ``pos`` to ``end``."""
    try:
        key_len, pos = decode_varint(buffer, pos)
        key = bytes(buffer[pos : pos + key_len]) if key_len >= 0 else None
        pos += max(key_len, 0)
        value_len, pos = decode_varint(buffer, pos)
        value = bytes(buffer[pos : pos + value_len]) if value_len >= 0 else None
        pos += max(value_len, 0)
        count, pos = decode_varint(buffer, pos)
        if count < 0:
            raise CorruptRecordError(f"Found invalid number of record headers {count}")
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(count):
            name_len, pos = decode_varint(buffer, pos)
            if name_len < 0:
                raise CorruptRecordError(f"Invalid negative header key size {name_len}")
            name = buffer[pos : pos + name_len].decode("utf-8")
            pos += name_len
            value_len, pos = decode_varint(buffer, pos)
            h_value = bytes(buffer[pos : pos + value_len]) if value_len >= 0 else None
            pos += max(value_len, 0)
            headers.append((name, h_value))
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"Found invalid record structure: {exc!r}") from exc
    if pos != end:
        raise CorruptRecordError(f"Invalid record size: expected to end at {end}, ended at {pos}")
    return key, value, headers
