"""Record batches as a broker returns them, for the tests of kmq's record unpacking."""

from __future__ import annotations

import struct

from kafka import TopicPartition
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

TP = TopicPartition("q", 3)
Rec = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]
"""key, value, headers"""


def batch(
    base_offset: int,
    records: list[Rec],
    *,
    gzip: bool = False,
    producer_id: int = -1,
    control: int | None = None,
    ts_step_ms: int = 1,
) -> bytes:
    """A record batch as a broker returns it (base offset set); ``control``: a control
    batch whose one record is an abort (0) or commit (1) marker."""
    txn = producer_id != -1
    builder = DefaultRecordBatchBuilder(
        2, DefaultRecordBatch.CODEC_GZIP if gzip else 0, txn, producer_id, 0 if txn else -1,
        0 if txn else -1, 1 << 20,
    )  # fmt: skip
    if control is not None:
        records = [(struct.pack(">hh", 0, control), b"", [])]
    for i, (key, value, headers) in enumerate(records):
        builder.append(
            i, timestamp=1_700_000_000_000 + i * ts_step_ms, key=key, value=value, headers=headers
        )
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base_offset)
    if control is not None:
        at = DefaultRecordBatch.ATTRIBUTES_OFFSET
        (attrs,) = struct.unpack_from(">h", buf, at)
        struct.pack_into(">h", buf, at, attrs | DefaultRecordBatch.CONTROL_MASK)
        crc = calc_crc32c(memoryview(buf)[at:])
        struct.pack_into(">I", buf, DefaultRecordBatch.CRC_OFFSET, crc)
    return bytes(buf)


def records(n: int) -> list[Rec]:
    return [(b"orders", b"x" * (i % 5), [("kmq.id", f"m-{i}".encode())]) for i in range(n)]
