"""MarkerWriter: batching per markers partition, and what a failing send leaves behind."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import MessageSizeTooLargeError

from kmq.marker_writer import MarkerWriter
from kmq.markers import Marker, MarkerType, decode_all


class StubProducer:
    """Records each send; refuses values over ``limit`` bytes, as kafka-python does."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.sent: list[tuple[int, list[Marker]]] = []

    def send(self, topic: str, *, key: bytes | None, value: bytes, partition: int) -> Any:
        if len(value) > self.limit:
            raise MessageSizeTooLargeError(f"{len(value)} bytes")
        self.sent.append((partition, decode_all(value)))
        return StubFuture()


class StubFuture:
    def add_errback(self, *args: object) -> None:
        pass


def marker(kind: MarkerType, message_id: str, value: bytes = b"") -> Marker:
    return Marker(kind, "q", 0, 1, message_id, 1, 1000, value=value)


def test_markers_are_sent_per_partition_in_order() -> None:
    writer, producer = MarkerWriter("m", 2, 1_000_000), StubProducer()
    writer.add(marker(MarkerType.START, "a"), 0)
    writer.add(marker(MarkerType.START, "b"), 1)
    writer.add(marker(MarkerType.END, "a"), 0)
    futures = writer.flush(producer)
    assert {p: len(f) for p, f in futures.items()} == {0: 1, 1: 1}
    assert [(p, [(m.type, m.message_id) for m in ms]) for p, ms in producer.sent] == [
        (0, [(MarkerType.START, "a"), (MarkerType.END, "a")]),
        (1, [(MarkerType.START, "b")]),
    ]
    assert writer.pending == 0


def test_a_refused_send_does_not_poison_later_flushes() -> None:
    # Before: the refused marker stayed pending, and every later flush raised again.
    writer, producer = MarkerWriter("m", 1, 1_000_000), StubProducer(limit=10_000)
    writer.add(marker(MarkerType.START, "huge", value=b"x" * 20_000), 0)
    with pytest.raises(MessageSizeTooLargeError):
        writer.flush(producer)
    assert writer.pending == 0
    writer.add(marker(MarkerType.END, "small"), 0)
    writer.flush(producer)
    assert [[m.message_id for m in ms] for _, ms in producer.sent] == [["small"]]
