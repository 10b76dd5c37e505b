"""``Producer.send_many``: every item is written before any is awaited, and each item's own
outcome is reported in order; bad input or a broker failure of one stops no other."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, NotLeaderForPartitionError

import kmq
from kmq.errors import BrokerError, InvalidMessageError, MessageTooLargeError


class StubFuture:
    def __init__(self, log: list[str], index: int, error: Exception | None) -> None:
        self._log, self._index, self._error = log, index, error

    def get(self, timeout: float | None = None) -> None:
        self._log.append(f"get {self._index}")
        if self._error is not None:
            raise self._error


class StubKafka:
    """Records sends and waits; ``fail`` maps a send's index to its future's error."""

    def __init__(self, fail: dict[int, Exception]) -> None:
        self.log: list[str] = []
        self.values: list[bytes] = []
        self._fail = fail

    def send(self, topic: str, *, value: bytes, **_: Any) -> StubFuture:
        index = len(self.values)
        self.values.append(value)
        self.log.append(f"send {index}")
        return StubFuture(self.log, index, self._fail.get(index))


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> StubKafka:
    kafka = StubKafka({1: NotLeaderForPartitionError("leader moved"), 2: KafkaTimeoutError("t")})
    monkeypatch.setattr(kmq.Service, "kafka_producer", lambda self: kafka)
    monkeypatch.setattr(kmq.Service, "write_partitions", lambda self, queue: (0, 1))
    return kafka


def test_a_batch_is_pipelined_and_each_item_reports_its_own_outcome(stub: StubKafka) -> None:
    producer = (
        kmq.Service(bootstrap_servers="127.0.0.1:1", max_message_bytes=10_000).queue("q").producer()
    )
    items: list[tuple[bytes, Any]] = [
        (b"ok-0", None),
        (b"broker-fails", {"h": b"v"}),
        (b"x" * 20_000, None),  # too large: never written
        (b"times-out", None),
        (b"bad-header", {"kmq.reserved": b"v"}),  # invalid: never written
        (b"ok-5", {"h": b"v"}),
    ]
    results = producer.send_many(items)
    assert len(results) == len(items)
    assert isinstance(results[0], str) and isinstance(results[5], str)
    assert results[0] != results[5]
    assert isinstance(results[1], BrokerError) and "leader moved" in str(results[1])
    assert isinstance(results[2], MessageTooLargeError)
    assert isinstance(results[3], BrokerError)
    assert isinstance(results[4], InvalidMessageError)
    assert stub.values == [b"ok-0", b"broker-fails", b"times-out", b"ok-5"]
    # Pipelined: all four written before the first is awaited.
    assert stub.log == [f"send {i}" for i in range(4)] + [f"get {i}" for i in range(4)]
