"""Queue pause and resume, stored in the control topic."""

from __future__ import annotations

import datetime
import time

import kmq
from tests.functional.helpers import wait_until
from tracker.daemon import Tracker


def test_paused_queue_delivers_and_redelivers_nothing_until_resumed(
    service: kmq.Service, tracker: Tracker
) -> None:
    q, other = service.queue("paused"), service.queue("running")
    q.producer().send(b"first")
    with q.consumer() as consumer, other.consumer() as other_consumer:
        held = consumer.receive(timeout_s=15)
        assert held is not None
        until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
        q.pause(until)
        wait_until(lambda: q.paused_until() is not None, 10, "the pause to be visible")
        wait_until(lambda: tracker.paused_until_ms("paused"), 10, "the tracker to see the pause")
        assert abs((q.paused_until() or until) - until) < datetime.timedelta(seconds=1)
        q.producer().send(b"second")
        other.producer().send(b"unaffected")
        held.nack(delay_s=0)  # due at once, but the tracker must hold it
        assert consumer.receive(timeout_s=3) is None
        other_msg = other_consumer.receive(timeout_s=15)
        assert other_msg is not None and other_msg.payload == b"unaffected"
        other_msg.ack()
        wait_until(lambda: tracker.stats()["postponed"] >= 1, 10, "the tracker to hold it")
        assert tracker.stats()["redeliveries"] == 0
        resumed_at = time.monotonic()
        q.resume()
        got: dict[bytes, int] = {}
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            msg = consumer.receive(timeout_s=0.5)
            if msg is not None:
                got[msg.payload] = msg.attempt
                msg.ack()
        assert got == {b"first": 2, b"second": 1}
        assert time.monotonic() - resumed_at < 15
    assert q.paused_until() is None


def test_pause_ends_by_itself(service: kmq.Service, tracker: Tracker) -> None:
    q = service.queue("brief")
    q.pause(datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3))
    wait_until(lambda: q.paused_until() is not None, 10, "the pause to be visible")
    q.producer().send(b"later")
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None and msg.payload == b"later"
        assert q.paused_until() is None
        msg.ack()
