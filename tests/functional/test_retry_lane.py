"""The retry lane: a redelivered copy does not wait behind its queue's backlog."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable

import kmq
from kmq.layout import mirrored
from tests.functional.conftest import REDELIVERY_TIMEOUT_S, Broker, Topics, worker_argv
from tests.functional.helpers import Children, wait_until
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


def test_a_killed_holders_copies_reach_a_live_reader_before_its_group_notices(
    broker: Broker,
    topics: Topics,
    make_service: Callable[..., kmq.Service],
    tracker: Tracker,
    children: Children,
) -> None:
    """Each consumer reads the retry-lane partitions that go with its queue partitions
    (kmq.layout.mirrored), and the tracker sends a copy to another consumer's: the copies of
    what a SIGKILLed worker held reach the other consumer while the group still waits for
    the dead member's session to run out, not after its rebalance."""
    session_ms = 6000  # copies are due after the 1 s lease: far sooner than this
    service = make_service(session_timeout_ms=session_ms)
    queue = service.queue("jobs")
    argv = worker_argv(broker, topics, "jobs", "w1", max_in_flight=4, hang_after=0)
    argv[argv.index("--session-timeout-ms") + 1] = str(session_ms)
    worker = children.python("worker", *argv)
    worker.wait_for('"event": "ready"', 30)
    window = service.write_partitions("jobs")
    retry_window = service.write_partitions("jobs", topics.retry)
    assert len(window) == len(retry_window) == 2
    with queue.consumer(max_in_flight=8) as consumer:

        def settled() -> bool:
            """Each member reads one queue partition and the retry partition that goes with
            it (so no partition is still on its way between them)."""
            mine = consumer.assignment()
            theirs = [e for e in worker.events() if e.get("event") == "assignment"]
            return (
                len(mine) == 1
                and consumer.retry_assignment() == mirrored(window, retry_window, mine)
                and bool(theirs)
                and set(theirs[-1]["queue"]) == set(window) - mine
                and set(theirs[-1]["retry"]) == set(retry_window) - consumer.retry_assignment()
            )

        wait_until(settled, 60, "each member to read the retry partition of its queue partition")
        mine = consumer.assignment()
        producer = queue.producer()
        for i in range(8):  # alternating partitions: four for each member
            producer.send(f"m{i}".encode())
        for _ in range(4):
            msg = consumer.receive(timeout_s=15)
            assert msg is not None and msg.attempt == 1
            msg.ack()
        lines = worker.wait_for('"event": "holding"', 30, count=4)
        held = {json.loads(line)["id"] for line in lines}
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait()
        mine_retry = consumer.retry_assignment()
        copies: dict[str, tuple[frozenset[int], frozenset[int]]] = {}
        deadline = time.monotonic() + 30
        while len(copies) < len(held) and time.monotonic() < deadline:
            msg = consumer.receive(timeout_s=0.5)
            if msg is not None:
                assert msg.attempt == 2 and msg.id in held, (msg.id, msg.attempt)
                # What the groups had given it by then.
                copies[msg.id] = (consumer.assignment(), consumer.retry_assignment())
                msg.ack()
        assert set(copies) == held
        assert set(copies.values()) == {(mine, mine_retry)}, (
            "a copy came only after the dead member's partitions moved here: it waited for "
            f"a rebalance ({copies})"
        )
