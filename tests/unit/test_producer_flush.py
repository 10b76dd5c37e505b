"""``Producer.flush()`` after ``send(wait=False)``: a message the broker never took is
reported, never silently dropped."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, NotLeaderForPartitionError
from kafka.future import Future

import kmq
from kmq import producer as producer_module


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


class AnsweringKafka(StubKafka):
    """Answers every send at once (failing those in ``fail``), except those in ``hold``,
    which stay unanswered until flush()."""

    def __init__(self, hold: set[int]) -> None:
        super().__init__()
        self.hold = hold
        self._lock = threading.Lock()  # kafka-python's send() is thread-safe too

    def send(self, topic: str, **kw: Any) -> Future:
        with self._lock:
            future = super().send(topic, **kw)
            index = len(self.futures) - 1
        if index in self.fail:
            future.failure(self.fail[index])
        elif index not in self.hold:
            future.success(None)
        return future

    def flush(self, timeout: float | None = None) -> None:
        for future in self.futures:
            if not future.is_done:
                future.success(None)


@pytest.mark.parametrize("hold", [set(), {0}], ids=["all answered", "first never answered"])
def test_answered_sends_are_not_kept_until_the_flush(
    monkeypatch: pytest.MonkeyPatch, hold: set[int]
) -> None:
    kafka = AnsweringKafka(hold)
    monkeypatch.setattr(kmq.Service, "kafka_producer", lambda self: kafka)
    monkeypatch.setattr(kmq.Service, "write_partitions", lambda self, queue: (0,))
    kafka.fail = {7: KafkaTimeoutError("early"), 19_999: KafkaTimeoutError("late")}
    p = producer()
    ids = [p.send(b"m", wait=False) for _ in range(20_000)]
    # Bounded whether or not the oldest send is answered (its partition's leader gone).
    assert len(p._unswept) <= 2 * producer_module._COMPACT_AT
    with pytest.raises(kmq.SendFailedError) as raised:
        p.flush()
    assert set(raised.value.failed) == {ids[7], ids[19_999]}
    assert not p._unswept


def test_sends_from_many_threads_are_all_accounted_for(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = AnsweringKafka(hold=set(range(0, 40_000, 97)))
    monkeypatch.setattr(kmq.Service, "kafka_producer", lambda self: kafka)
    monkeypatch.setattr(kmq.Service, "write_partitions", lambda self, queue: (0,))
    kafka.fail = {i: KafkaTimeoutError(str(i)) for i in range(5, 40_000, 101)}
    p = producer()
    sent: list[str] = []

    def send_many() -> None:
        for _ in range(10_000):
            sent.append(p.send(b"m", wait=False))

    threads = [threading.Thread(target=send_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with pytest.raises(kmq.SendFailedError) as raised:
        p.flush()
    # Which ids failed depends on the threads' interleaving; how many does not.
    assert len(raised.value.failed) == len(kafka.fail)
    assert set(raised.value.failed) <= set(sent) and len(set(sent)) == 40_000
    assert not p._unswept
