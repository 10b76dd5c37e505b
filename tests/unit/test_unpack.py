"""kmq's record unpacking (kmq.unpack, kmq.record_v2) held to kafka-python's own: real record
batches, unpacked by kafka-python's fetcher class and by kmq's, compared field by field."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kmq import kafka_clients, unpack
from kmq.record_v2 import records as v2_records
from tests.unit.record_batches import TP, Rec, batch, fetch_of, fetches, records, transactions


def take_all(cls: Any, data: bytes, fetch_offset: int = 0, **kw: Any) -> tuple[list[Any], Any]:
    """Every ConsumerRecord a poll returns of ``data`` (taken as max_records would), and the
    partition data once read to its end."""
    part = cls(fetch_offset, TP, MemoryRecords(data), **kw)
    out = []
    while part:
        out.extend(part.take(7))
    return out, part


def same_as_kafka_python(data: bytes, fetch_offset: int = 0, **kw: Any) -> list[Any]:
    """kmq's records of ``data``, checked against kafka-python's take by take: the records
    (every field), and the position each take leaves (where the next fetch starts)."""
    theirs = Fetcher.PartitionRecords(fetch_offset, TP, MemoryRecords(data), **kw)
    ours = unpack.Records(fetch_offset, TP, MemoryRecords(data), **kw)
    got = []
    while theirs:
        took = ours.take(7)
        assert took == theirs.take(7)
        assert ours.next_fetch_offset == theirs.next_fetch_offset
        got.extend(took)
    assert not ours and ours.next_fetch_offset == theirs.next_fetch_offset
    assert ours.records_read == theirs.records_read
    assert ours.leader_epoch == theirs.leader_epoch
    return got


def test_records_are_kafka_pythons_consumer_records() -> None:
    data = batch(100, records(10)) + batch(110, records(10), gzip=True) + batch(120, records(3))
    got = same_as_kafka_python(data, fetch_offset=103)
    assert [r.offset for r in got] == list(range(103, 123))
    assert got[0].headers == [("kmq.id", b"m-3")] and got[0].serialized_header_size == 9


def test_deltas_of_several_bytes_and_null_keys_values_and_headers() -> None:
    recs: list[Rec] = [(None, None, [("h", None)]), (b"k" * 300, b"v" * 70_000, [("é", b"")])]
    same_as_kafka_python(batch(1_000, records(200) + recs, ts_step_ms=100_000))


def test_deserializers_are_applied_as_kafka_python_applies_them() -> None:
    class Upper:
        def deserialize(self, topic: str, headers: Any, data: bytes | None) -> Any:
            return (topic, len(headers), data.upper() if data is not None else None)

    got = same_as_kafka_python(
        batch(0, records(3)), key_deserializer=Upper(), value_deserializer=Upper()
    )
    assert got[0].key == ("q", 1, b"ORDERS") and got[0].serialized_key_size == 6


def test_aborted_transactions_and_control_batches() -> None:
    data, kw = transactions()
    got = same_as_kafka_python(data, **kw)
    assert [r.offset for r in got] == [6, 7, 8, 9, 11, 12]


def test_legacy_batches_are_read_as_kafka_python_reads_them() -> None:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    for i in range(4):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"v%d" % i)
    got = same_as_kafka_python(bytes(builder.build()), fetch_offset=1)
    assert [r.value for r in got] == [b"v1", b"v2", b"v3"]


def test_a_record_whose_length_runs_past_its_batch_is_corrupt() -> None:
    data = bytearray(batch(0, records(1)))  # a record of about 25 bytes
    data[DefaultRecordBatch.HEADER_STRUCT.size] = 0x7E  # its length: 63
    with pytest.raises(CorruptRecordError, match="Invalid record size 63"):
        take_all(unpack.Records, bytes(data), check_crcs=False)


def test_a_record_shorter_than_its_length_is_corrupt() -> None:
    data = bytearray(batch(0, records(2)))
    at = DefaultRecordBatch.HEADER_STRUCT.size
    data[at] += 2  # the first record's length one byte more (zigzag): it swallows a byte
    with pytest.raises(CorruptRecordError, match="Invalid record size: expected"):
        take_all(unpack.Records, bytes(data), check_crcs=False)


def test_bytes_after_the_last_record_are_corrupt() -> None:
    data = batch(0, records(1)) + b""
    one = bytearray(data)
    one[DefaultRecordBatch.HEADER_STRUCT.size - 4 : DefaultRecordBatch.HEADER_STRUCT.size] = (
        b"\x00\x00\x00\x00"  # records_count 0: the record is left over
    )
    parsed = DefaultRecordBatch(bytes(one))
    with pytest.raises(CorruptRecordError, match="unconsumed bytes"):
        list(v2_records(parsed))


def test_wanted_offsets_are_asked_again_after_each_record() -> None:
    parsed = DefaultRecordBatch(batch(0, records(10)))
    wanted = [frozenset({1, 2, 8})]
    found = []
    for offset, *_ in v2_records(parsed, lambda: wanted[0]):
        found.append(offset)
        wanted[0] = frozenset({offset + 1, 9}) if offset == 1 else wanted[0]
    assert found == [1, 2, 9]


def test_every_kmq_consumer_unpacks_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    made = SimpleNamespace(_fetcher=SimpleNamespace(PartitionRecords=Fetcher.PartitionRecords))
    monkeypatch.setattr(kafka_clients, "_build", lambda *a, **kw: made)
    conn = kafka_clients.KafkaConnection("127.0.0.1:9", kafka_clients.KafkaSecurity())
    assert kafka_clients.consumer(conn) is made
    assert made._fetcher.PartitionRecords is unpack.Records


def test_the_hook_takes_on_kafka_pythons_own_consumer() -> None:
    consumer = KafkaConsumer(
        bootstrap_servers="127.0.0.1:9", api_version=(2, 8, 0), enable_auto_commit=False
    )
    try:
        assert unpack.install(consumer)
        assert consumer._fetcher.PartitionRecords is unpack.Records
    finally:
        consumer.close()


def test_a_consumer_without_the_hook_is_left_alone() -> None:
    assert not unpack.install(SimpleNamespace())
    assert not unpack.install(SimpleNamespace(_fetcher=None))


@settings(max_examples=150, deadline=None)
@given(
    batches=fetches,
    fetch_offset=st.integers(min_value=0, max_value=10),
    ts_step_ms=st.sampled_from([0, 1, 100_000]),
)
def test_any_batches_unpack_as_kafka_python_unpacks_them(
    batches: list[tuple[list[Rec], bool]], fetch_offset: int, ts_step_ms: int
) -> None:
    data, count = fetch_of(batches, ts_step_ms)
    assert len(same_as_kafka_python(data, fetch_offset)) == max(0, count - fetch_offset)
