"""Kafka records to Arrow columns (the DataSource's decoding), without Spark or a broker."""

from __future__ import annotations

import datetime as dt
from collections import namedtuple
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from kmq._proto import marker_pb2
from kmq.audit.transforms import MARKER_COLUMNS
from kmq.markers import RETRY_LANE, Marker, MarkerType, encode, encode_batch, encode_entries
from kmq.markers_v1 import encode_batch_v1, encode_v1
from kmq.records import dead_letter_headers, parse_queue_headers, queue_headers
from kmq.spark.columns import MarkerColumns, QueueColumns, _kmq_headers, marker_type_name
from kmq.spark.kafka_io import RecordRun
from kmq.spark.schemas import MARKERS_SCHEMA, QUEUE_SCHEMA

Record = namedtuple("Record", "partition offset timestamp key value headers")
TS = 1_700_000_000_123


def _rows(columns: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = columns.flush().to_pylist()
    return rows


def test_queue_columns_decode_kmq_records() -> None:
    cols = QueueColumns(to_arrow_schema(QUEUE_SCHEMA))
    cols.extend(
        [
            Record(1, 7, TS, b"orders", b"hi", queue_headers("abc", 3, [("trace", b"t1")])),
            Record(0, 2, -1, None, None, [("x", None)]),
        ]
    )
    assert cols.rows == 2
    first, other = _rows(cols)
    assert first == {
        "partition": 1,
        "offset": 7,
        "timestamp": dt.datetime.fromtimestamp(TS / 1000, dt.UTC),
        "queue": "orders",
        "message_id": "abc",
        "attempt": 3,
        "dead_letter_origin": None,
        "headers": [{"key": "trace", "value": b"t1"}],
        "payload": b"hi",
    }
    # written by something else: the id a kmq consumer would give it, attempt 1
    assert (other["message_id"], other["attempt"], other["queue"]) == ("ext-0-2", 1, None)
    assert other["timestamp"] is None and other["headers"] == [{"key": "x", "value": b""}]
    assert cols.rows == 0 and _rows(cols) == []


def test_queue_columns_name_the_origin_of_dead_letters() -> None:
    schema = StructType([f for f in QUEUE_SCHEMA.fields if f.name in ("dead_letter_origin",)])
    cols = QueueColumns(to_arrow_schema(schema))
    letter = dead_letter_headers("m", "orders", 3, "x", ())
    cols.extend([Record(0, 0, TS, b"orders.dlq", b"", letter),
                 Record(0, 1, TS, b"orders", b"", queue_headers("n", 1, ()))])  # fmt: skip
    assert _rows(cols) == [{"dead_letter_origin": "orders"}, {"dead_letter_origin": None}]


def test_queue_columns_filter_one_queue_and_build_only_the_asked_columns() -> None:
    schema = StructType([f for f in QUEUE_SCHEMA.fields if f.name in ("offset", "message_id")])
    cols = QueueColumns(to_arrow_schema(schema), queue="b")
    cols.extend([Record(0, i, TS, q, b"", queue_headers(f"m{i}", 1, ())) for i, q in
                 enumerate([b"a", b"b", b"b"])])  # fmt: skip
    assert _rows(cols) == [{"offset": 1, "message_id": "m1"}, {"offset": 2, "message_id": "m2"}]


header_names = st.sampled_from(["kmq.id", "kmq.attempt", "kmq.dlq.origin", "u", ""])
header_values = st.one_of(
    st.none(),
    st.sampled_from([b"", b"0", b"01", b"7", b"x", b"12", b"2147483648", b"99999999999"]),
)


@settings(deadline=None)
@given(st.lists(st.tuples(header_names, header_values), max_size=5))
def test_fast_header_path_agrees_with_parse_queue_headers(headers: list[Any]) -> None:
    message_id, attempt, user = parse_queue_headers(headers)
    got_id, got_attempt, got_user = _kmq_headers(headers, 3, 9)
    as_column = attempt if attempt < 2**31 else None  # an int32 column: null past it
    assert (got_id, got_attempt, list(got_user)) == (message_id or "ext-3-9", as_column, list(user))


def test_an_attempt_past_the_int32_column_is_null_not_a_failed_read() -> None:
    huge = [("kmq.id", b"m1"), ("kmq.attempt", b"99999999999")]
    assert _kmq_headers(huge, 0, 1) == ("m1", None, [])
    assert _kmq_headers([("kmq.id", b"m1"), ("kmq.attempt", b"2147483647")], 0, 1)[1] == 2**31 - 1


def _marker_record(offset: int, value: bytes | None) -> Record:
    return Record(2, offset, TS, b"k", value, [])


def test_marker_columns_keep_every_field_and_name_unknown_types() -> None:
    # A version 1 marker (kmq 0.1) carries every field, payload included.
    start = encode_v1(
        type=MarkerType.START, queue="orders", partition=1, offset=42, message_id="m1",
        attempt=2, redeliver_after_ms=30_000, key=b"orders", value=b"body",
        headers=[("h", b"v")], max_attempts=5, dead_letter_queue="orders.dlq",
    )  # fmt: skip
    future = marker_pb2.Marker(version=1, type=42, queue="q", message_id="m2")  # type: ignore[arg-type]
    cols = MarkerColumns(to_arrow_schema(MARKERS_SCHEMA))
    cols.extend(
        [
            _marker_record(0, start),
            _marker_record(1, future.SerializeToString()),
            _marker_record(2, b"\xff\xff"),
            _marker_record(3, None),
            _marker_record(
                4, marker_pb2.Marker(version=1, type=marker_pb2.END).SerializeToString()
            ),
        ]
    )
    rows = _rows(cols)
    assert rows[0] == {
        "marker_partition": 2,
        "marker_offset": 0,
        "timestamp": dt.datetime.fromtimestamp(TS / 1000, dt.UTC),
        "type": "START",
        "type_id": 1,
        "version": 1,
        "lane": 0,
        "queue": "orders",
        "partition": 1,
        "offset": 42,
        "message_id": "m1",
        "attempt": 2,
        "redeliver_after_ms": 30_000,
        "key": b"orders",
        "value": b"body",
        "headers": [{"key": "h", "value": b"v"}],
        "reason": "",
        "max_attempts": 5,
        "dead_letter_queue": "orders.dlq",
        "error": None,
    }
    assert (rows[1]["type"], rows[1]["type_id"], rows[1]["error"]) == ("UNKNOWN_42", 42, None)
    assert rows[2]["error"].startswith("not a protobuf marker") and rows[2]["type"] is None
    assert rows[3]["error"] == "marker record has no value"
    assert rows[4]["error"] == "marker has no message id" and rows[4]["queue"] is None
    assert rows[4]["marker_offset"] == 4


def test_marker_columns_of_one_queue_and_other_versions() -> None:
    v2 = marker_pb2.Marker(version=2, type=1, queue="a", message_id="m")  # type: ignore[arg-type]
    schema = StructType([f for f in MARKERS_SCHEMA.fields if f.name in ("type", "queue", "error")])
    cols = MarkerColumns(to_arrow_schema(schema), queue="a")
    cols.extend(
        [
            _marker_record(0, encode_v1(type=MarkerType.END, queue="a", message_id="m")),
            _marker_record(1, encode_v1(type=MarkerType.END, queue="b", message_id="m")),
            _marker_record(2, v2.SerializeToString()),
            _marker_record(3, b"junk"),
            _marker_record(4, encode(Marker(MarkerType.END, 0, 0))),  # names no queue: kept
        ]
    )
    assert _rows(cols) == [
        {"type": "END", "queue": "a", "error": None},
        {"type": "START", "queue": "a", "error": "unsupported marker version 2"},
        {"type": "END", "queue": None, "error": None},
    ]
    assert marker_type_name(int(MarkerType.DEAD_LETTERED)) == "DEAD_LETTERED"


def test_marker_columns_expand_batch_records_in_order() -> None:
    batch: list[dict[str, Any]] = [
        {"type": MarkerType.START, "queue": "a", "offset": 5, "message_id": "m1",
         "redeliver_after_ms": 1000, "value": b"x"},
        {"type": MarkerType.END, "queue": "b", "offset": 6, "message_id": "m2"},
        {"type": MarkerType.END, "queue": "a", "offset": 5, "message_id": "m1"},
    ]  # fmt: skip
    schema = StructType(
        [f for f in MARKERS_SCHEMA.fields if f.name in ("marker_offset", "type", "message_id")]
    )
    cols = MarkerColumns(to_arrow_schema(schema), queue="a")
    cols.extend(
        [_marker_record(7, encode_batch_v1(batch)), _marker_record(8, encode_v1(**batch[1]))]
    )
    assert _rows(cols) == [
        {"marker_offset": 7, "type": "START", "message_id": "m1"},
        {"marker_offset": 7, "type": "END", "message_id": "m1"},
    ]


def test_marker_columns_of_version_2_markers() -> None:
    """A version 2 marker names its record by lane, partition and offset; it carries no
    queue, message id, key, value or headers (null), and no queue filter leaves it out."""
    batch = [
        Marker(MarkerType.START, 1, 42, attempt=2, redeliver_after_ms=30_000, max_attempts=5,
               dead_letter_queue="orders.dlq"),
        Marker(MarkerType.NACK, 3, 4, reason="boom", lane=RETRY_LANE),
    ]  # fmt: skip
    cols = MarkerColumns(to_arrow_schema(MARKERS_SCHEMA))
    cols.extend(
        [
            _marker_record(0, encode_batch(batch)),
            _marker_record(1, encode_entries([(99, 0, 1, 2, 1, 0, 0, 0)], [])),
            _marker_record(2, b"\x02\x00"),
        ]
    )
    start, nack, unknown, short = _rows(cols)
    assert start == {
        "marker_partition": 2,
        "marker_offset": 0,
        "timestamp": dt.datetime.fromtimestamp(TS / 1000, dt.UTC),
        "type": "START",
        "type_id": 1,
        "version": 2,
        "lane": 0,
        "queue": None,
        "partition": 1,
        "offset": 42,
        "message_id": None,
        "attempt": 2,
        "redeliver_after_ms": 30_000,
        "key": None,
        "value": None,
        "headers": None,
        "reason": "",
        "max_attempts": 5,
        "dead_letter_queue": "orders.dlq",
        "error": None,
    }
    assert (nack["marker_offset"], nack["type"], nack["lane"], nack["reason"]) == (
        0,
        "NACK",
        RETRY_LANE,
        "boom",
    )
    assert (nack["dead_letter_queue"], nack["error"]) == ("", None)
    assert unknown["error"] == "unknown marker type 99" and unknown["type"] is None
    assert "too short" in short["error"]
    filtered = MarkerColumns(to_arrow_schema(MARKERS_SCHEMA), queue="orders")
    filtered.extend([_marker_record(0, encode_batch(batch))])
    assert [r["type"] for r in _rows(filtered)] == ["START", "NACK"]


# Reading record batches whole (kmq.spark.kafka_io): the same records kafka-python reads.

record_fields = st.tuples(
    st.integers(0, 2**40),  # timestamp
    st.one_of(st.none(), st.binary(max_size=80)),  # key
    st.one_of(st.none(), st.binary(max_size=300)),  # value
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
    ),
)


def _batch(base: int, records: list[Any], compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 22,
    )  # fmt: skip
    for i, (ts, key, value, headers) in enumerate(records):
        builder.append(i, ts, key, value, headers)
    buf = bytearray(builder.build())
    buf[0:8] = base.to_bytes(8, "big")  # as the broker does; not covered by the CRC
    return bytes(buf)


@settings(deadline=None, max_examples=60)
@given(
    st.lists(record_fields, min_size=1, max_size=40),
    st.integers(0, 10**9),
    st.integers(0, 45),
    st.integers(0, 45),
    st.sampled_from([0, 1]),  # no compression, gzip
)
def test_whole_batch_decoding_reads_what_kafka_python_reads(
    records: list[Any], base: int, lo: int, hi: int, compression: int
) -> None:
    data = _batch(base, records, compression)
    expected = [
        (r.offset, r.timestamp, r.key, r.value, r.headers)
        for r in DefaultRecordBatch(data)
        if base + lo <= r.offset < base + hi
    ]
    run = RecordRun()
    run.add_batch(5, DefaultRecordBatch(data), base + lo, base + hi)
    assert run.headers is not None
    got = list(zip(run.offsets, run.timestamps, run.keys, run.values, run.headers, strict=True))
    assert got == expected
    assert run.partitions == [5] * len(expected)
    bare = RecordRun(with_headers=False)
    bare.add_batch(5, DefaultRecordBatch(data), base + lo, base + hi)
    assert bare.headers is None and bare.values == [e[3] for e in expected]


def test_whole_batch_decoding_rejects_a_corrupt_batch() -> None:
    data = bytearray(_batch(0, [(1, b"k", b"value", [("h", b"x")])]))
    assert data[-2:] == b"\x02x"
    data[-2] = 0x04  # the header value's length (zigzag): 2 bytes, past the record's end
    with pytest.raises(CorruptRecordError):
        RecordRun().add_batch(0, DefaultRecordBatch(bytes(data)), 0, 10)


# Version 2 markers decoded a column at a time: the same rows as one record at a time.

v2_entries = st.tuples(
    st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 42]),  # type, some unknown
    st.sampled_from([0, 1, 0, 2]),  # lane, one unknown
    st.integers(-1, 2**31 - 1),  # partition
    st.integers(-1, 2**40),  # offset
    st.sampled_from([0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1]),  # attempt
    st.integers(0, 2**32 - 1),  # redeliver_after_ms
    st.sampled_from([0, 5, 2**32 - 1]),  # max_attempts
    st.sampled_from(["", "", "bad input", "orders.dlq", "é"]),  # text
)


def _v2_value(entries: list[Any]) -> bytes:
    texts = [t.encode() for *_, t in entries]
    return encode_entries([(*e[:7], len(t)) for e, t in zip(entries, texts, strict=True)],
                          [t for t in texts if t])  # fmt: skip


marker_values = st.one_of(
    st.lists(v2_entries, min_size=1, max_size=4).map(_v2_value),
    st.lists(v2_entries, min_size=1, max_size=4).map(lambda e: _v2_value(e)[:-1]),  # cut short
    st.sampled_from(
        [
            None,
            b"\x02",
            b"\x02\x00\x00\x00\x00",
            b"junk",
            encode_v1(type=MarkerType.END, queue="a", message_id="m"),
            encode_v1(type=MarkerType.START, queue="b", message_id="n", offset=3),
        ]
    ),
)


@settings(deadline=None, max_examples=150)
@given(
    st.lists(marker_values, max_size=12),
    st.sampled_from([None, "a"]),
    st.sampled_from([list(MARKERS_SCHEMA.fieldNames()), list(MARKER_COLUMNS)]),
)
def test_version_2_markers_decode_by_column_as_by_record(
    values: list[bytes | None], queue: str | None, names: list[str]
) -> None:
    schema = to_arrow_schema(StructType([f for f in MARKERS_SCHEMA.fields if f.name in names]))
    records = [Record(3, 100 + i, TS + i if i % 3 else -1, b"k", v, []) for i, v in
               enumerate(values)]  # fmt: skip
    fast = MarkerColumns(schema, queue)
    fast.extend(records)
    one_by_one = MarkerColumns(schema, queue)
    run = RecordRun.of(records)
    reference = one_by_one._slow_batch(run, list(range(len(records))))[0]
    assert fast.rows == reference.num_rows
    assert fast.flush().to_pylist() == reference.to_pylist()
