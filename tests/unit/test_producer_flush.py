"""``Producer.flush()`` after ``send(wait=False)``: a message the broker never took is
reported, never silently dropped."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, NotLeaderForPartitionError
from kafka.future import Future

import kmq


class StubKafka:
    """send() returns kafka-python's own Future; flush() settles them, failing the sends
    whose index is in ``fail``."""

    def __init__(self) -> None:
        self.fail: dict[int, Exception] = {}
        self.futures: list[Future] = []
        self.flushed = 0

    def send(self, topic: str, **_: Any) -> Future:
        self.futures.append(Future())
        return self.futures[-1]

    def flush(self, timeout: float | None = None) -> None:
        for index, future in enumerate(self.futures[self.flushed :], self.flushed):
            if index in self.fail:
                future.failure(self.fail[index])
            else:
                future.success(None)
        self.flushed = len(self.futures)


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> StubKafka:
    kafka = StubKafka()
    monkeypatch.setattr(kmq.Service, "kafka_producer", lambda self: kafka)
    monkeypatch.setattr(kmq.Service, "write_partitions", lambda self, queue: (0,))
    return kafka


def producer() -> kmq.Producer:
    return kmq.Service(bootstrap_servers="127.0.0.1:1").queue("q").producer()


def test_flush_names_every_message_the_broker_did_not_take(stub: StubKafka) -> None:
    p = producer()
    stub.fail = {1: NotLeaderForPartitionError("leader moved"), 3: KafkaTimeoutError("t")}
    ids = [p.send(f"m{i}".encode(), wait=False) for i in range(5)]
    with pytest.raises(kmq.SendFailedError) as raised:
        p.flush()
    assert set(raised.value.failed) == {ids[1], ids[3]}
    assert isinstance(raised.value.failed[ids[1]], NotLeaderForPartitionError)
    assert isinstance(raised.value, kmq.BrokerError)
    assert "2 message(s)" in str(raised.value) and "leader moved" in str(raised.value)
    p.flush()  # reported once: nothing new has failed since


def test_a_failure_after_a_clean_flush_is_reported_by_the_next(stub: StubKafka) -> None:
    p = producer()
    p.send(b"a", wait=False)
    p.flush()
    stub.fail = {1: KafkaTimeoutError("t")}
    late = p.send(b"b", wait=False)
    with pytest.raises(kmq.SendFailedError) as raised:
        p.flush()
    assert list(raised.value.failed) == [late]


def test_each_producer_reports_only_its_own_sends(stub: StubKafka) -> None:
    service = kmq.Service(bootstrap_servers="127.0.0.1:1")
    mine, other = service.queue("q").producer(), service.queue("r").producer()
    stub.fail = {1: KafkaTimeoutError("t")}
    mine.send(b"a", wait=False)
    failed = other.send(b"b", wait=False)
    mine.flush()  # the shared Kafka producer is flushed; none of mine failed
    with pytest.raises(kmq.SendFailedError) as raised:
        other.flush()
    assert list(raised.value.failed) == [failed]
