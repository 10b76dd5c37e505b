"""Fast loops with durable acks: receive_many, ack_many, and acks from many threads."""

from __future__ import annotations

import threading
import time

import pytest

import kmq
from tests.functional.conftest import Broker, Topics
from tests.functional.helpers import read_markers, wait_until
from tracker.daemon import Tracker


def test_receive_many_and_ack_many_settle_a_batch_for_good(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("batch")
    sent = {q.producer().send(b"%d" % i) for i in range(25)}
    got: list[kmq.Message] = []
    with q.consumer(max_in_flight=50) as consumer:
        deadline = time.monotonic() + 20
        while len(got) < 25 and time.monotonic() < deadline:
            batch = consumer.receive_many(10, timeout_s=1)
            assert len(batch) <= 10
            got.extend(batch)
            consumer.ack_many(batch)
        assert {m.id for m in got} == sent
        assert all(m.state is kmq.message.State.ACKED for m in got)
        assert consumer.in_flight == 0
        assert consumer.receive(timeout_s=2.5) is None, "an acked message came back"
    ends = [m for m in read_markers(broker.bootstrap_servers, topics) if m.type.name == "END"]
    assert sorted(m.message_id for m in ends) == sorted(sent)
    assert tracker.stats()["redeliveries"] == 0


def test_ack_many_checks_every_message_before_writing_anything(service: kmq.Service) -> None:
    q = service.queue("strict")
    for i in range(3):
        q.producer().send(b"%d" % i)
    with q.consumer() as consumer, service.queue("other").consumer() as other:
        got: list[kmq.Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            got += consumer.receive_many(3, timeout_s=1)
        assert len(got) == 3
        got[0].ack()
        with pytest.raises(kmq.MessageStateError, match="already settled"):
            consumer.ack_many(got)
        with pytest.raises(kmq.MessageStateError, match="not received by this consumer"):
            other.ack_many(got[1:])
        assert [m.state.value for m in got] == ["acked", "held", "held"]
        consumer.ack_many(got[1:])
        with pytest.raises(kmq.InvalidArgumentError, match="max_messages"):
            consumer.receive_many(0)


def test_durable_acks_from_many_threads_all_land(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    """Eight handler threads ack(wait=True) at once; each returns only once its END is on
    the broker, and their ENDs share records (group commit)."""
    q = service.queue("threads")
    sent = {q.producer().send(b"%d" % i) for i in range(80)}
    acked: list[str] = []
    lock = threading.Lock()
    with q.consumer(max_in_flight=80) as consumer:

        def handler() -> None:
            while True:
                message = consumer.receive(timeout_s=2)
                if message is None:
                    return
                message.ack()  # durable: the END is on the broker when this returns
                with lock:
                    acked.append(message.id)

        threads = [threading.Thread(target=handler) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(acked) == sorted(sent)
    markers = read_markers(broker.bootstrap_servers, topics)
    ends = [m for m in markers if m.type.name == "END"]
    assert sorted(m.message_id for m in ends) == sorted(sent)
    wait_until(lambda: tracker.stats()["in_flight"] == 0, 10, "the tracker to see every END")
    assert tracker.stats()["redeliveries"] == 0


def test_synchronous_sends_from_many_threads_all_land(service: kmq.Service) -> None:
    q = service.queue("sync-sends")
    ids: list[str] = []
    lock = threading.Lock()

    def sender() -> None:
        for i in range(25):
            message_id = q.producer().send(b"%d" % i)  # returns once the broker has it
            with lock:
                ids.append(message_id)

    threads = [threading.Thread(target=sender) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(ids)) == 200
    with q.consumer(max_in_flight=200) as consumer:
        got: set[str] = set()
        deadline = time.monotonic() + 30
        while len(got) < 200 and time.monotonic() < deadline:
            batch = consumer.receive_many(100, timeout_s=1)
            got |= {m.id for m in batch}
            consumer.ack_many(batch)
    assert got == set(ids)
