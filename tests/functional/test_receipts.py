"""Handing a message over (Consumer.hand_off) and settling it by receipt from elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import kmq
from tracker.daemon import Tracker

LEASE_S = 1.0


def take(q: kmq.Queue, consumer: kmq.Consumer, payload: bytes) -> kmq.Message:
    q.producer().send(payload)
    message = consumer.receive(timeout_s=15)
    assert message is not None and message.payload == payload
    return message


def test_a_handed_off_message_is_settled_from_another_service(
    make_service: Callable[..., kmq.Service], tracker: Tracker
) -> None:
    here, elsewhere = make_service(), make_service()  # two proxy replicas, say
    q = here.queue("handed")
    settler = kmq.Settler(elsewhere)
    try:
        with q.consumer() as consumer:
            acked = take(q, consumer, b"ack me")
            receipt = kmq.Receipt.decode(consumer.hand_off(acked, 3.0).encode())
            assert acked.state is kmq.message.State.HANDED_OFF
            assert consumer.in_flight == 0, "the consumer no longer keeps it alive"
            with pytest.raises(kmq.MessageStateError):
                acked.ack()
            settler.extend(receipt, 5.0)
            settler.ack(receipt)
            released = take(q, consumer, b"release me")
            settler.release(consumer.hand_off(released, 30.0))
            again = consumer.receive(timeout_s=10)
            assert again is not None and (again.id, again.attempt) == (released.id, 1)
            nacked = take(q, consumer, b"nack me")
            settler.nack(consumer.hand_off(nacked, 30.0), delay_s=0.5, reason="later")
            later = consumer.receive(timeout_s=10)
            assert later is not None and (later.id, later.attempt) == (nacked.id, 2)
            for m in (again, later):
                m.ack()
            assert consumer.receive(timeout_s=2.5 * LEASE_S) is None, "the ack came back"
    finally:
        settler.close()
    assert tracker.stats()["redeliveries"] == 2


def test_an_unsettled_hand_off_comes_back_after_its_lease(
    service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("forgotten")
    with q.consumer() as consumer:
        message = take(q, consumer, b"forget me")
        handed = time.monotonic()
        consumer.hand_off(message, 2.0)
        # the consumer's own lease is 1 s, but it no longer keeps it: the receipt's 2 s do
        assert consumer.receive(timeout_s=1.5) is None
        again = consumer.receive(timeout_s=10)
        assert again is not None and (again.id, again.attempt) == (message.id, 2)
        assert time.monotonic() - handed >= 2.0
        again.ack()


def test_a_rejected_receipt_is_dead_lettered_by_the_tracker(
    service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("bad")
    settler = kmq.Settler(service)
    try:
        with q.consumer() as consumer:
            message = take(q, consumer, b"poison")
            settler.reject(consumer.hand_off(message, 30.0), "unparseable")
        with service.queue(q.dead_letter_queue).consumer() as dlq:
            letter = dlq.receive(timeout_s=15)
            assert letter is not None and (letter.id, letter.payload) == (message.id, b"poison")
            assert letter.headers["kmq.dlq.reason"] == b"unparseable"
            letter.ack()
    finally:
        settler.close()
