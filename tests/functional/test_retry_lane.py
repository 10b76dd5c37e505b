"""The retry lane: a redelivered copy does not wait behind its queue's backlog."""

from __future__ import annotations

import time

import kmq
from tests.functional.conftest import REDELIVERY_TIMEOUT_S
from tracker.daemon import Tracker

BACKLOG = 10_000
BOUND_S = 2.0
"""The documented guarantee: a copy reaches a consumer within its lease (or nack delay) plus
this, however many records of the queue wait on the queue topic."""


def test_copies_overtake_a_backlog_of_ten_thousand(service: kmq.Service, tracker: Tracker) -> None:
    q = service.queue("busy")
    producer = q.producer()
    for i in range(BACKLOG):
        producer.send(b"%d" % i, wait=False)
    producer.flush()
    with q.consumer(max_in_flight=50) as consumer:
        head = consumer.receive(timeout_s=20)
        assert head is not None
        waits: dict[str, tuple[float, float]] = {}  # copy id -> (sent back at, allowed delay)
        head.nack(delay_s=0, reason="again at once")
        waits[head.id] = (time.monotonic(), 0.0)
        delayed = consumer.receive(timeout_s=5)
        assert delayed is not None
        delayed.nack(delay_s=0.5, reason="in half a second")
        waits[delayed.id] = (time.monotonic(), 0.5)
        dropped = consumer.receive(timeout_s=5)
        assert dropped is not None
        consumer.hand_off(dropped, REDELIVERY_TIMEOUT_S)  # handed to a holder that then dies
        waits[dropped.id] = (time.monotonic(), REDELIVERY_TIMEOUT_S)
        seen = 3
        late: dict[str, float] = {}
        deadline = time.monotonic() + 30
        while len(late) < len(waits) and time.monotonic() < deadline:
            message = consumer.receive(timeout_s=1)
            if message is None:
                continue
            if message.attempt > 1 and message.id in waits:
                sent_back, allowed = waits[message.id]
                late[message.id] = time.monotonic() - sent_back - allowed
            else:
                seen += 1
                time.sleep(0.002)  # work: the consumer stays far behind the backlog
            message.ack()
        assert set(late) == set(waits), f"copies never came back: {set(waits) - set(late)}"
        assert max(late.values()) <= BOUND_S, f"copies late beyond the bound: {late}"
        assert seen < BACKLOG / 2, "the backlog had mostly drained: the test proves nothing"
