"""Owns entries read past a held markers partition (tracker.peek): pure parts and the
adapter over a stub consumer; the daemon's use of it in test_daemon.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka import TopicPartition

from kmq.markers import MarkerType, encode_entries
from tracker.orphans import owns_text
from tracker.peek import HELD_S, OwnsPeek, owns_entries, to_peek

PROBE, START = int(MarkerType.PROBE), int(MarkerType.START)
TOPIC = "kmq.markers"


def beacon(clock: int, partitions: set[int], sent_ms: int, nonce: int = 0) -> bytes:
    text = owns_text(clock, partitions)
    return encode_entries([(PROBE, 0, 1, sent_ms, nonce, 0, 0, len(text))], [text])


def test_to_peek_takes_partitions_held_at_least_held_s() -> None:
    behind = {0: 0.0, 1: HELD_S - 0.01, 2: HELD_S, 3: 30.0}
    assert to_peek(behind) == {2, 3}
    assert to_peek({}) == frozenset()
    assert to_peek(behind, held_s=0.0) == {0, 1, 2, 3}


def test_owns_entries_are_read_from_beacons_only() -> None:
    assert owns_entries(beacon(7, {0, 2}, 12_345)) == [(7, frozenset({0, 2}), 12.345)]
    start = (START, 0, 3, 77, 1, 30_000, 0, 0)
    assert owns_entries(encode_entries([start], [])) == [], "a START"
    assert owns_entries(beacon(7, {1}, 5, nonce=99)) == [], "a tracker's own PROBE"
    not_owns = b"clock 1 2"
    plain = encode_entries([(PROBE, 0, 1, 5, 0, 0, 0, len(not_owns))], [not_owns])
    assert owns_entries(plain) == [], "a beacon's other text"
    assert owns_entries(b"\x02junk") == [] and owns_entries(None) == [], "not a marker"
    both = encode_entries(
        [start, (PROBE, 0, 1, 9_000, 0, 0, 0, len(owns_text(3, {4})))], [b"", owns_text(3, {4})]
    )
    assert owns_entries(both) == [(3, frozenset({4}), 9.0)]


@dataclass
class Rec:
    value: bytes


@dataclass
class StubConsumer:
    batches: list[dict[Any, list[Rec]]] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("assign", [tp.partition for tp in partitions]))

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.calls.append(("seek", partition.partition, offset))

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Rec]]:
        self.calls.append(("poll", timeout_ms))
        return self.batches.pop(0) if self.batches else {}

    def close(self) -> None:
        self.calls.append(("close",))


def test_follow_assigns_the_held_partitions_and_starts_new_ones_where_reading_stands() -> None:
    c = StubConsumer()
    peek = OwnsPeek(c, TOPIC)
    peek.follow(frozenset({1}), {1: 40, 3: 70})
    peek.follow(frozenset({1}), {1: 45})  # the same: nothing changes
    peek.follow(frozenset({1, 3}), {1: 45, 3: 70})
    peek.follow(frozenset(), {})
    assert c.calls == [
        ("assign", [1]), ("seek", 1, 40),
        ("assign", [1, 3]), ("seek", 3, 70),
        ("assign", []),
    ]  # fmt: skip
    assert peek.following == frozenset()


def test_read_polls_without_waiting_and_only_while_following() -> None:
    c = StubConsumer(batches=[{TopicPartition(TOPIC, 1): [Rec(beacon(5, {0}, 1_000))]}])
    peek = OwnsPeek(c, TOPIC)
    assert peek.read() == [] and c.calls == [], "nothing followed: no fetch at all"
    peek.follow(frozenset({1}), {1: 0})
    assert peek.read() == [(5, frozenset({0}), 1.0)]
    assert ("poll", 0) in c.calls
    peek.close()
    assert c.calls[-1] == ("close",)


@pytest.mark.parametrize("value", [b"", b"\x01", b"\x02\x00\x00"])
def test_a_record_that_is_not_a_marker_is_passed_over(value: bytes) -> None:
    assert owns_entries(value) == []
