"""Record batches as a broker returns them, for the tests of kmq's record unpacking."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st
from kafka import TopicPartition
from kafka.protocol.consumer import IsolationLevel
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


def transactions() -> tuple[bytes, dict[str, Any]]:
    """A fetch with transactions, and the read_committed settings to unpack it: offsets 0-4
    an aborted transaction of producer 7, 5 its abort marker, 6-9 committed records of
    producer 8, 10 their commit marker, 11-12 plain records."""
    data = (
        batch(0, records(5), producer_id=7)
        + batch(5, [], producer_id=7, control=0)
        + batch(6, records(4), producer_id=8)
        + batch(10, [], producer_id=8, control=1)
        + batch(11, records(2))
    )
    return data, {
        "isolation_level": IsolationLevel.READ_COMMITTED,
        "aborted_transactions": [SimpleNamespace(producer_id=7, first_offset=0)],
    }


_bytes = st.one_of(st.none(), st.binary(max_size=40))
_record = st.tuples(_bytes, _bytes, st.lists(st.tuples(st.text(max_size=8), _bytes), max_size=3))
fetches = st.lists(
    st.tuples(st.lists(_record, min_size=1, max_size=12), st.booleans()),
    min_size=1,
    max_size=5,
)
"""Random fetches: up to 5 batches of up to 12 records, each batch gzipped or not."""


def fetch_of(batches: list[tuple[list[Rec], bool]], ts_step_ms: int = 1) -> tuple[bytes, int]:
    """``batches`` (records, gzipped) as one fetch from offset 0, and how many records."""
    data, base = b"", 0
    for recs, gzip in batches:
        data += batch(base, recs, gzip=gzip, ts_step_ms=ts_step_ms)
        base += len(recs)
    return data, base
