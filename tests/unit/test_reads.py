"""What consumers announce they read (kmq.reads) and what the tracker makes of it
(tracker.readers.LiveReaders)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.reads import MAX_PARTITIONS, READS_HEADER, decode_reads, encode_reads
from tracker.readers import LiveReaders

queues = st.text(
    st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs")), min_size=1, max_size=20
)


@settings(max_examples=300, deadline=None)
@given(queues, st.sets(st.integers(0, 2**31 - 1), min_size=1, max_size=50))
def test_reads_round_trip(queue: str, partitions: set[int]) -> None:
    assert decode_reads(encode_reads(queue, partitions)) == (queue, frozenset(partitions))


def test_encoding() -> None:
    assert encode_reads("orders", {4, 3}) == b"orders 3,4"
    many = range(MAX_PARTITIONS + 5)
    decoded = decode_reads(encode_reads("q", many))
    assert decoded is not None and len(decoded[1]) == MAX_PARTITIONS


@pytest.mark.parametrize(
    "value",
    [None, b"", b"orders", b"orders ", b" 3", b"orders 3,x", b"orders -1", b"\xff 3", b"q 3,,4"],
)
def test_malformed_values_decode_to_none(value: bytes | None) -> None:
    assert decode_reads(value) is None


def test_a_partition_is_live_while_a_consumer_said_so_lately() -> None:
    readers = LiveReaders(fresh_s=3.0)
    readers.note([(READS_HEADER, b"orders 3,4"), ("other", b"x")], 10.0)
    readers.note([(READS_HEADER, b"orders 5")], 12.0)
    readers.note([(READS_HEADER, b"mail 3")], 12.0)
    assert readers.live("orders", 12.5) == {3, 4, 5}
    assert readers.live("orders", 13.5) == {5}, "3 and 4 unsaid for over 3 s"
    assert readers.live("mail", 13.5) == {3} and readers.live("nobody", 13.5) == set()
    readers.note([(READS_HEADER, b"orders 3,4")], 14.0)
    assert readers.live("orders", 15.5) == {3, 4}


def test_within_a_shorter_time_only_the_partitions_said_since_count() -> None:
    readers = LiveReaders(fresh_s=1.0)
    readers.note([(READS_HEADER, b"orders 1,3")], 10.0)  # its reader killed right after
    readers.note([(READS_HEADER, b"orders 3")], 10.5)  # a spare's reader, every 0.4 s
    assert readers.live("orders", 10.8) == {1, 3}
    assert readers.live("orders", 10.8, within_s=0.6) == {3}
    assert readers.live("orders", 10.8, within_s=5.0) == {1, 3}, "never beyond fresh_s"
    assert readers.live("orders", 11.2, within_s=0.6) == set()
    assert readers.live("orders", 11.2) == {3}


def test_bad_headers_change_nothing() -> None:
    readers = LiveReaders()
    readers.note([(READS_HEADER, None), (READS_HEADER, b"garbage"), ("kmq.other", b"q 1")], 1)
    readers.note([(READS_HEADER, b"garbage")], 1)  # cached as bad
    assert readers.live("garbage", 1) == set() and readers.live("q", 1) == set()
