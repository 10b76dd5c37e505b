"""Fast loops with durable acks: receive_many, ack_many, and acks from many threads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import partial

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


def test_batches_polled_during_a_slow_commit_share_the_next_one(
    broker: Broker, topics: Topics, service: kmq.Service
) -> None:
    """One offset commit in flight per Kafka consumer: batches polled while it is held up
    wait, and go together in the next commit (one per batch piled up behind a stalled
    coordinator, and kafka-python refuses a sixth request in flight). Still nothing is
    handed out before the commit that covers it is over."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.future import Future

    q = service.queue("slowcommit")
    gate = threading.Event()
    calls: list[dict[TopicPartition, int]] = []
    held: list[tuple[Future, Future]] = []
    with q.consumer() as consumer:
        real = consumer._kc.commit_async

        def slow_commit(offsets: dict[TopicPartition, object]) -> Future:
            calls.append({tp: meta.offset for tp, meta in offsets.items()})  # type: ignore[attr-defined]
            inner, outer = real(offsets), Future()
            if gate.is_set():
                return inner
            held.append((inner, outer))
            return outer

        consumer._kc.commit_async = slow_commit
        sent = []
        for i in range(3):
            sent.append(q.producer().send(b"%d" % i))
            wait_until(partial(_committing, consumer, i + 1), 20, f"batch {i} polled")
        assert len(calls) == 1, f"a commit per batch while one was in flight: {calls}"
        assert consumer.receive(timeout_s=0) is None, "handed out before its commit was over"
        gate.set()
        for inner, outer in held:
            wait_until(partial(getattr, inner, "is_done"), 20, "the held commit")
            if inner.succeeded():
                outer.success(inner.value)
            else:
                outer.failure(inner.exception)
        got: list[kmq.Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            message = consumer.receive(timeout_s=1)
            if message is not None:
                got.append(message)
                message.ack()
        assert sorted(m.id for m in got) == sorted(sent)
        assert len(calls) == 2, f"the waiting batches were not committed together: {calls}"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        committed = admin.list_group_offsets({consumer.group_id: None})[consumer.group_id]
    finally:
        admin.close()
    per_partition = Counter(m.partition for m in got)
    assert {tp.partition: meta.offset for tp, meta in committed.items()
            if tp.topic == topics.queue} == dict(per_partition)  # fmt: skip


def _committing(consumer: kmq.Consumer, batches: int) -> bool:
    return len(consumer._committing) == batches
