"""The records of a Kafka message format v2 batch, read straight from its buffer.

kafka-python parses each record into a ``DefaultRecord`` and then a ``ConsumerRecord``,
several microseconds a record; this reads the same layout (Kafka protocol, record batch v2)
in one loop, with kafka-python's checks (record sizes, header counts, trailing bytes), and
steps over the records a caller does not want by their length without parsing them. Used by
the consumers' fetchers (:mod:`kmq.unpack`), the tracker's re-read and the Spark Data Source.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from typing import Any

from kafka.errors import CorruptRecordError
from kafka.record.util import decode_varint

Headers = list[tuple[str, bytes | None]]
Record = tuple[int, int, bytes | None, bytes | None, Headers]
"""offset, timestamp, key, value, headers"""

_LOG_APPEND_TIME = 1


def records(
    batch: Any, wanted: Callable[[], Container[int] | None] | None = None
) -> Iterator[Record]:
    """The records of ``batch`` (kafka-python's ``DefaultRecordBatch``, compressed or not) in
    offset order. ``wanted``: called before the first record and again after each record
    yielded (what is wanted may change meanwhile); records whose offset is not in what it
    returns are stepped over unparsed (``None``: every record)."""
    batch._maybe_uncompress()  # kafka-python's own decompression, if any
    buf = bytes(batch._buffer)
    pos: int = batch._pos
    size_all = len(buf)
    varint = decode_varint
    base: int = batch.base_offset
    first_ts: int = batch.first_timestamp
    fixed_ts: int | None = batch.max_timestamp if batch.timestamp_type == _LOG_APPEND_TIME else None
    offsets = wanted() if wanted is not None else None
    # Varints inline when they take one byte (zigzag: (b >> 1) ^ -(b & 1)), the common case.
    try:
        for _ in range(batch.records_count):
            b = buf[pos]
            if b < 128:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 128:  # two bytes: records of 64 to 8,191 bytes
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = varint(buf, pos)
            end = pos + length
            if length < 0 or end > size_all:
                raise CorruptRecordError(f"Invalid record size {length}")
            b = buf[pos + 1]  # after the attributes (int8, unused)
            if b < 128:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                ts_delta, pos = varint(buf, pos + 1)
            b = buf[pos]
            if b < 128:
                offset = base + ((b >> 1) ^ -(b & 1))
                pos += 1
            else:
                delta, pos = varint(buf, pos)
                offset = base + delta
            if offsets is not None and offset not in offsets:
                pos = end
                continue
            b = buf[pos]
            if b < 128:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                size, pos = varint(buf, pos)
            if size >= 0:
                key: bytes | None = buf[pos : pos + size]
                pos += size
            else:
                key = None
            b = buf[pos]
            if b < 128:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                size, pos = varint(buf, pos)
            if size >= 0:
                value: bytes | None = buf[pos : pos + size]
                pos += size
            else:
                value = None
            count = buf[pos]
            if count < 128:
                count = (count >> 1) ^ -(count & 1)
                pos += 1
            else:
                count, pos = varint(buf, pos)
            if count < 0:
                raise CorruptRecordError(f"Found invalid number of record headers {count}")
            headers: Headers = []
            while count:
                size, pos = varint(buf, pos)
                if size < 0:
                    raise CorruptRecordError(f"Invalid negative header key size {size}")
                name = buf[pos : pos + size].decode("utf-8")
                pos += size
                size, pos = varint(buf, pos)
                if size >= 0:
                    headers.append((name, buf[pos : pos + size]))
                    pos += size
                else:
                    headers.append((name, None))
                count -= 1
            if pos != end:
                raise CorruptRecordError(
                    f"Invalid record size: expected to read {length} bytes in record "
                    f"payload, but instead read {pos - end + length}"
                )
            ts = fixed_ts if fixed_ts is not None else first_ts + ts_delta
            yield offset, ts, key, value, headers
            if wanted is not None:
                offsets = wanted()
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"Found invalid record structure: {exc!r}") from exc
    if pos != size_all:
        raise CorruptRecordError(f"{size_all - pos} unconsumed bytes after all records consumed")
