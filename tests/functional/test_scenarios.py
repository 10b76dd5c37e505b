"""The kafka-mq-go functional scenarios (reference section 1), against a real broker.

Their setup: two partitions per topic and a 1 s redelivery timeout. kmq's nack redelivers
(kafka-mq-go's does not), so the nack scenarios give a delay longer than the watch window,
and kafka-mq-go's "interrupt" (stop keep-alives, redeliver after the timeout) is nack(0).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import kmq
from tests.functional.helpers import wait_until
from tracker.daemon import Tracker

WATCH_S = 2.0


def test_receive_without_waiting_returns_nothing(service: kmq.Service) -> None:
    consumer = service.queue("empty").consumer()
    started = time.monotonic()
    assert consumer.receive(timeout_s=0) is None
    assert time.monotonic() - started < 0.5
    consumer.close()
    with pytest.raises(kmq.ConsumerClosedError):
        consumer.receive(timeout_s=0)


def test_ack_is_never_redelivered(service: kmq.Service, tracker: Tracker) -> None:
    q = service.queue("a")
    sent = q.producer().send(b"hello", headers={"trace": b"t-1"})
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None
        assert (msg.id, msg.payload, msg.attempt, msg.queue) == (sent, b"hello", 1, "a")
        assert dict(msg.headers) == {"trace": b"t-1"}
        msg.ack()
        assert consumer.receive(timeout_s=WATCH_S) is None
    wait_until(lambda: tracker.stats()["end"] == 1, 10, "the tracker to read the END")
    assert tracker.stats()["redeliveries"] == 0
    assert tracker.stats()["in_flight"] == 0


def test_nack_with_delay_is_not_redelivered_early(service: kmq.Service, tracker: Tracker) -> None:
    q = service.queue("a")
    sent = q.producer().send(b"x")
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None
        nacked_at = time.monotonic()
        msg.nack(delay_s=3.0, reason="busy")
        assert consumer.receive(timeout_s=WATCH_S) is None
        again = consumer.receive(timeout_s=10)
        assert again is not None
        assert time.monotonic() - nacked_at >= 3.0
        assert (again.id, again.attempt, again.payload) == (sent, 2, b"x")
        again.ack()
        assert consumer.receive(timeout_s=WATCH_S) is None
    assert tracker.stats()["redeliveries"] == 1


def test_interrupted_message_comes_back_then_ack_ends_it(
    service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("a")
    sent = q.producer().send(b"x")
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None
        msg.nack()
        again = consumer.receive(timeout_s=WATCH_S)
        assert again is not None
        assert (again.id, again.attempt) == (sent, 2)
        again.ack()
        assert consumer.receive(timeout_s=WATCH_S) is None


def test_two_consumers_share_500_messages(service: kmq.Service, tracker: Tracker) -> None:
    q = service.queue("bulk")
    consumers = [q.consumer(), q.consumer()]
    try:
        wait_until(
            lambda: all(c.assignment() for c in consumers), 20, "both consumers to own a partition"
        )
        producer = q.producer()
        sent = {producer.send(b"%d" % i, wait=False) for i in range(500)}
        producer.flush()
        got: list[Counter[str]] = [Counter(), Counter()]

        def drain(i: int) -> None:
            deadline = time.monotonic() + 30
            while sum(sum(c.values()) for c in got) < 500 and time.monotonic() < deadline:
                msg = consumers[i].receive(timeout_s=0.2)
                if msg is not None:
                    got[i][msg.id] += 1
                    msg.ack()

        threads = [threading.Thread(target=drain, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(got[0]) | set(got[1]) == sent
        assert sum(got[0].values()) > 0 and sum(got[1].values()) > 0
    finally:
        for c in consumers:
            c.close()


def test_queues_only_see_their_own_messages(service: kmq.Service, tracker: Tracker) -> None:
    b, c = service.queue("B"), service.queue("C")
    id_b = b.producer().send(b"for B")
    id_c = c.producer().send(b"for C")
    with b.consumer() as cb, c.consumer() as cc:
        mb, mc = cb.receive(timeout_s=15), cc.receive(timeout_s=15)
        assert mb is not None and mc is not None
        assert (mb.id, mb.queue, mb.payload) == (id_b, "B", b"for B")
        assert (mc.id, mc.queue, mc.payload) == (id_c, "C", b"for C")
        mb.ack()
        mc.ack()
        assert cb.receive(timeout_s=WATCH_S) is None
        assert cc.receive(timeout_s=0) is None
    assert tracker.stats()["redeliveries"] == 0


def test_ack_on_one_queue_delayed_nack_on_another(service: kmq.Service, tracker: Tracker) -> None:
    b, c = service.queue("B"), service.queue("C")
    b.producer().send(b"b")
    c.producer().send(b"c")
    with b.consumer() as cb, c.consumer() as cc:
        mb, mc = cb.receive(timeout_s=15), cc.receive(timeout_s=15)
        assert mb is not None and mc is not None
        mb.ack()
        mc.nack(delay_s=10)
        assert cb.receive(timeout_s=WATCH_S) is None
        assert cc.receive(timeout_s=0) is None
    assert tracker.stats()["redeliveries"] == 0


def test_only_the_interrupted_queue_is_redelivered(service: kmq.Service, tracker: Tracker) -> None:
    b, c = service.queue("B"), service.queue("C")
    id_b = b.producer().send(b"b")
    c.producer().send(b"c")
    with b.consumer() as cb, c.consumer() as cc:
        mb, mc = cb.receive(timeout_s=15), cc.receive(timeout_s=15)
        assert mb is not None and mc is not None
        mb.nack()
        mc.ack()
        again = cb.receive(timeout_s=WATCH_S + 1)
        assert again is not None and (again.id, again.attempt) == (id_b, 2)
        assert cc.receive(timeout_s=0) is None
        again.ack()
        assert cb.receive(timeout_s=WATCH_S) is None
        assert cc.receive(timeout_s=0) is None
    assert tracker.stats()["redeliveries"] == 1
