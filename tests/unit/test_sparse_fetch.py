"""The re-read consumer's sparse record parsing (tracker.sparse_fetch), held to kafka-python's
own: real record batches, unpacked by kafka-python's fetcher class with and without it."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch

from tests.unit.record_batches import TP, Rec, batch, fetch_of, fetches, records, transactions
from tracker import sparse_fetch
from tracker.reread import RecordReader


def sparse_class(wanted: dict[Any, frozenset[int]]) -> Any:
    consumer = SimpleNamespace(_fetcher=SimpleNamespace(PartitionRecords=Fetcher.PartitionRecords))
    assert sparse_fetch.install(consumer, wanted)
    return consumer._fetcher.PartitionRecords


def unpack(cls: Any, data: bytes, fetch_offset: int = 0, **kw: Any) -> tuple[list[Any], int]:
    """What a poll returns of ``data``, and the next fetch offset once it is all read."""
    part = cls(fetch_offset, TP, MemoryRecords(data), **kw)
    out = []
    while part:  # drained: read to the end
        out.extend(part.take(7))  # as poll's max_records would take them
    return [
        (r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers)
        for r in out
    ], part.next_fetch_offset


def test_only_the_wanted_records_are_returned_exactly_as_kafka_python_reads_them() -> None:
    data = batch(100, records(10)) + batch(110, records(10), gzip=True) + batch(120, records(5))
    wanted = frozenset({101, 109, 112, 124, 500})
    full, full_next = unpack(Fetcher.PartitionRecords, data)
    sparse, sparse_next = unpack(sparse_class({TP: wanted}), data)
    assert sparse == [r for r in full if r[2] in wanted]
    assert [r[2] for r in sparse] == [101, 109, 112, 124]
    assert sparse_next == full_next == 125, "the position moves past what was skipped"


def test_offset_and_time_deltas_of_several_bytes() -> None:
    data = batch(1000, records(200), ts_step_ms=100_000)  # deltas from 64 on: 2+ bytes
    wanted = frozenset({1000, 1063, 1064, 1150, 1199})
    full, _ = unpack(Fetcher.PartitionRecords, data)
    sparse, _ = unpack(sparse_class({TP: wanted}), data)
    assert sparse == [r for r in full if r[2] in wanted] and len(sparse) == 5


def test_records_unpacked_during_one_scan_are_read_on_with_the_next_scans_offsets() -> None:
    # kafka-python keeps a partition's unpacked records across a re-assignment and returns
    # them when the new position is where they stopped: filtered by the first scan's
    # offsets, the next scan's would be stepped over, and taken for gone.
    for gzip in (False, True):
        wanted = {TP: frozenset({3})}
        data = batch(0, records(10), gzip=gzip) + batch(10, records(10), gzip=not gzip)
        part = sparse_class(wanted)(0, TP, MemoryRecords(data))
        assert [r.offset for r in part.take(1)] == [3]
        wanted[TP] = frozenset({4, 5, 15})
        assert [r.offset for r in part.take(2)] == [4, 5]
        wanted.clear()  # no scan names the partition: every record
        assert [r.offset for r in part.take(100)] == list(range(6, 20))


def test_a_partition_not_named_gets_every_record() -> None:
    data = batch(0, records(4))
    other = TopicPartition("q", 9)
    assert unpack(sparse_class({other: frozenset({1})}), data) == unpack(
        Fetcher.PartitionRecords, data
    )


def test_nothing_wanted_in_a_fetch_still_moves_the_position() -> None:
    data = batch(0, records(4)) + batch(4, records(4))
    assert unpack(sparse_class({TP: frozenset({50})}), data) == ([], 8)


def test_the_batches_past_the_last_wanted_offset_are_left_unread() -> None:
    bad = bytearray(batch(8, records(4)))
    bad[-1] ^= 0xFF  # a CRC error, raised if this batch were read
    data = batch(0, records(4)) + batch(4, records(4)) + bytes(bad)
    got, position = unpack(sparse_class({TP: frozenset({1, 5})}), data)
    assert [r[2] for r in got] == [1, 5]
    assert position == 8, "the position stops at the cut"
    with pytest.raises(CorruptRecordError):
        unpack(Fetcher.PartitionRecords, data)
    with pytest.raises(CorruptRecordError):  # wanted past the bad batch: it is read
        unpack(sparse_class({TP: frozenset({1, 20})}), data)


def test_a_cut_never_moves_the_position_back_before_the_fetch_offset() -> None:
    data = batch(0, records(4)) + batch(4, records(4)) + batch(8, records(4))
    # Wanted offsets all behind the fetch offset (a stale scan's): read on to a batch
    # past the fetch offset, not back to the first batch past the wanted ones.
    assert unpack(sparse_class({TP: frozenset({1})}), data, fetch_offset=6) == ([], 8)


def test_aborted_transactions_and_control_batches_are_kafka_pythons() -> None:
    data, kw = transactions()
    wanted = frozenset({2, 5, 7, 10, 12})
    full, full_next = unpack(Fetcher.PartitionRecords, data, **kw)
    sparse, sparse_next = unpack(sparse_class({TP: wanted}), data, **kw)
    assert [r[2] for r in full] == [6, 7, 8, 9, 11, 12]
    assert sparse == [r for r in full if r[2] in wanted] and [r[2] for r in sparse] == [7, 12]
    assert sparse_next == full_next == 13


def test_a_fetch_from_the_middle_of_a_batch_starts_at_its_offset() -> None:
    data = batch(0, records(10))
    wanted = frozenset({2, 6})
    assert unpack(sparse_class({TP: wanted}), data, fetch_offset=4)[0] == [
        r for r in unpack(Fetcher.PartitionRecords, data, fetch_offset=4)[0] if r[2] == 6
    ]


def test_a_record_whose_length_runs_past_its_batch_is_corrupt() -> None:
    data = bytearray(batch(0, records(1)))  # a record of about 25 bytes
    data[DefaultRecordBatch.HEADER_STRUCT.size] = 0x7E  # its length: 63
    with pytest.raises(CorruptRecordError, match="Invalid record size 63"):
        unpack(sparse_class({TP: frozenset({0})}), bytes(data), check_crcs=False)


def test_the_hook_takes_on_kafka_pythons_own_consumer() -> None:
    # Built without a broker (the API version given); the tracker's re-read consumer is one.
    consumer = KafkaConsumer(
        bootstrap_servers="127.0.0.1:9", api_version=(2, 8, 0), enable_auto_commit=False
    )
    try:
        assert sparse_fetch.install(consumer, {})
        hooked = consumer._fetcher.PartitionRecords
        assert hooked is not Fetcher.PartitionRecords
        assert issubclass(hooked, Fetcher.PartitionRecords)
    finally:
        consumer.close()


def test_the_record_reader_hooks_its_consumer() -> None:
    reader: Any = SimpleNamespace(
        _fetcher=SimpleNamespace(PartitionRecords=Fetcher.PartitionRecords)
    )
    RecordReader(reader, {0: "q"})
    assert reader._fetcher.PartitionRecords is not Fetcher.PartitionRecords


def test_a_consumer_without_the_hook_is_left_alone() -> None:
    assert not sparse_fetch.install(SimpleNamespace(), {})
    assert not sparse_fetch.install(SimpleNamespace(_fetcher=None), {})


@settings(max_examples=150, deadline=None)
@given(
    batches=fetches,
    picks=st.sets(st.integers(min_value=0, max_value=70), max_size=20),
    fetch_offset=st.integers(min_value=0, max_value=10),
)
def test_sparse_is_kafka_python_filtered(
    batches: list[tuple[list[Rec], bool]], picks: set[int], fetch_offset: int
) -> None:
    data, count = fetch_of(batches)
    wanted = frozenset(picks)
    full, full_next = unpack(Fetcher.PartitionRecords, data, fetch_offset)
    sparse, sparse_next = unpack(sparse_class({TP: wanted}), data, fetch_offset)
    assert sparse == [r for r in full if r[2] in wanted]
    assert full_next == count
    # The fetch is read up to the first batch past every wanted offset (and past the fetch
    # offset), and the position stops there.
    bases = list(itertools.accumulate((len(recs) for recs, _ in batches), initial=0))[:-1]
    cut = [b for b in bases if wanted and b > max(max(wanted), fetch_offset)]
    assert sparse_next == (cut[0] if cut else count)
