"""The retry lane: a redelivered copy does not wait behind its queue's backlog."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

import kmq
from kmq.layout import mirrored
from kmq.records import new_message_id, queue_headers
from kmq.topics import ensure_topics
from tests.functional.conftest import (
    REDELIVERY_TIMEOUT_S,
    Broker,
    RunningTracker,
    Topics,
    tracker_config_for,
    worker_argv,
)
from tests.functional.helpers import Child, Children, wait_until
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


def holding_worker(broker: Broker, topics: Topics, children: Children, session_ms: int) -> Child:
    """A worker process on queue "jobs" that holds the four messages it takes, unsettled."""
    argv = worker_argv(broker, topics, "jobs", "w1", max_in_flight=4, hang_after=0)
    argv[argv.index("--session-timeout-ms") + 1] = str(session_ms)
    worker = children.python("worker", *argv)
    worker.wait_for('"event": "ready"', 30)
    return worker


def wait_for_one_partition_each(
    service: kmq.Service, topics: Topics, consumer: kmq.Consumer, worker: Child
) -> None:
    """Until the consumer and the worker each read one of the two queue partitions of
    "jobs" and the retry partition that goes with it (none on its way between them)."""
    window = service.write_partitions("jobs")
    retry_window = service.write_partitions("jobs", topics.retry)
    assert len(window) == len(retry_window) == 2

    def settled() -> bool:
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
    worker = holding_worker(broker, topics, children, session_ms)
    with queue.consumer(max_in_flight=8) as consumer:
        wait_for_one_partition_each(service, topics, consumer, worker)
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


@contextlib.contextmanager
def one_partition_queue(
    broker: Broker, queue_partitions: int, session_ms: int
) -> Iterator[tuple[Topics, RunningTracker, kmq.Service]]:
    """Topics of its own on which queue "jobs" is spread over one partition of
    ``queue_partitions``, a tracker, and a service whose consumers have ``session_ms``
    sessions."""
    tag = uuid.uuid4().hex[:10]
    topics = Topics(f"s{tag}.queue", f"s{tag}.markers", f"s{tag}.control")
    names: dict[str, Any] = {
        "bootstrap_servers": broker.bootstrap_servers,
        "queue_topic": topics.queue,
        "marker_topic": topics.markers,
        "control_topic": topics.control,
    }
    ensure_topics(
        kmq.ServiceConfig(
            **names, queue_partitions=queue_partitions, queue_spread=1, marker_partitions=2
        )
    )
    running = RunningTracker(tracker_config_for(broker, topics))
    service = kmq.Service(
        **names, redelivery_timeout_s=REDELIVERY_TIMEOUT_S, session_timeout_ms=session_ms
    )
    try:
        assert running.tracker.wait_caught_up(30), "tracker never caught up"
        assert len(service.write_partitions("jobs")) == 1
        assert len(service.write_partitions("jobs", topics.retry)) == 1
        yield topics, running, service
    finally:
        service.close()
        running.stop()


def owning_worker(
    broker: Broker, topics: Topics, children: Children, service: kmq.Service, session_ms: int
) -> Child:
    """A holding worker (holding_worker), once it owns the queue's partition."""
    window = service.write_partitions("jobs")
    worker = holding_worker(broker, topics, children, session_ms)
    wait_until(
        lambda: any(e.get("queue") == list(window) for e in worker.events()),
        60,
        "the worker to own the queue's partition",
    )
    return worker


def kill_holding_four(service: kmq.Service, worker: Child) -> tuple[set[str], float]:
    """Send four messages, wait for the worker to hold them, SIGKILL it: (their ids, when)."""
    producer = service.queue("jobs").producer()
    for i in range(4):
        producer.send(f"m{i}".encode())
    lines = worker.wait_for('"event": "holding"', 30, count=4)
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    return {json.loads(line)["id"] for line in lines}, time.monotonic()


def test_an_idle_members_spare_takes_the_copies_when_every_owner_is_killed(
    broker: Broker, children: Children
) -> None:
    """A queue spread over one partition, read by a worker that holds what it takes and by
    a consumer that owns nothing (more consumers than partitions). The group's leader gives
    the idle one a spare retry-lane partition (kmq.layout.spare_candidates), which it says
    it reads; when the worker is SIGKILLed, the tracker sends its copies there, and they
    reach the idle consumer while the group still waits for the dead member's session to
    run out. Before spares, they went to the dead owner's retry partition and waited for
    the group to notice and rebalance."""
    session_ms = 15_000  # copies are due after the 1 s lease: far sooner than this
    with one_partition_queue(broker, 4, session_ms) as (topics, running, service):
        retry_window = service.write_partitions("jobs", topics.retry)
        worker = owning_worker(broker, topics, children, service, session_ms)
        with service.queue("jobs").consumer(max_in_flight=8) as idle:
            wait_until(
                lambda: bool(idle.retry_assignment()) and not idle.assignment(),
                60,
                "the idle consumer to be given a spare",
            )
            spares = idle.retry_assignment()
            assert not spares & set(retry_window), spares
            wait_until(
                lambda: running.tracker.live_readers("jobs") >= spares,
                15,
                "the tracker to hear that the idle consumer reads its spare",
            )
            held, killed_at = kill_holding_four(service, worker)
            got: dict[str, tuple[int, int]] = {}
            while len(got) < len(held) and time.monotonic() < killed_at + 30:
                msg = idle.receive(timeout_s=0.5)
                if msg is not None:
                    assert msg.attempt == 2 and msg.id in held, (msg.id, msg.attempt)
                    assert not idle.assignment(), "the group moved the dead member's partition"
                    got[msg.id] = (msg.lane, msg.partition)
                    msg.ack()
            assert set(got) == held
            assert {lane for lane, _ in got.values()} == {1}
            assert {partition for _, partition in got.values()} <= spares, got


def test_a_copy_on_a_spare_is_still_watched_after_a_change_of_tracker(
    broker: Broker, children: Children
) -> None:
    """The loss of chaos seed 440940772, staged. A consumer owns the queue's one partition;
    an idle worker (more consumers than partitions) reads a spare, holds the one message
    it takes, and so takes no more. A second copy goes to that spare (its reader is heard,
    keep-alives), and the tracker watches it. That tracker stops, the idle worker freezes
    (SIGSTOP: still in its group for its 15 s session), another tracker takes over. The
    copy's WATCH marker carries the watch over: the new tracker copies it again to the
    owner's retry partition once the spare falls silent. Without it, nobody would ever read
    that copy: the group gives the spare to no one once the idle member is gone."""
    session_ms = 15_000
    with one_partition_queue(broker, 4, session_ms) as (topics, running, service):
        retry_window = service.write_partitions("jobs", topics.retry)
        queue = service.queue("jobs")
        second: RunningTracker | None = None
        with queue.consumer(max_in_flight=8) as owner:
            wait_until(lambda: bool(owner.assignment()), 60, "the consumer to own the partition")
            argv = worker_argv(broker, topics, "jobs", "idle", max_in_flight=1, hang_after=0)
            argv[argv.index("--session-timeout-ms") + 1] = str(session_ms)
            idle = children.python("worker", *argv)
            try:
                wait_until(
                    lambda: any(
                        e.get("event") == "assignment" and not e["queue"] and e["retry"]
                        for e in idle.events()
                    ),
                    60,
                    "the idle worker to be given a spare",
                )
                wait_until(
                    lambda: running.tracker.live_readers("jobs") - set(retry_window),
                    15,
                    "the tracker to hear that the idle worker reads its spare",
                )
                producer = queue.producer()
                producer.send(b"held by the idle worker")
                producer.send(b"left on the spare")
                taken = [owner.receive(timeout_s=15) for _ in range(2)]
                assert all(m is not None and m.attempt == 1 for m in taken)
                held, left = [m for m in taken if m is not None]
                held.nack(delay_s=0, reason="to the spare")
                idle.wait_for('"event": "holding"', 30)  # full now: it takes no more
                left.nack(delay_s=0, reason="to the spare too")
                wait_until(
                    lambda: running.tracker.stats()["redeliveries:nacked"] == 2,
                    15,
                    "the second copy to be written",
                )
                running.stop()
                assert running.tracker.stats()["redeliveries:unread"] == 0, "it looked already"
                os.kill(idle.pid, signal.SIGSTOP)
                frozen_at = time.monotonic()
                second = RunningTracker(running.tracker.config)
                assert second.tracker.wait_caught_up(30), "the second tracker never caught up"
                back = None
                while back is None and time.monotonic() - frozen_at < 30:
                    msg = owner.receive(timeout_s=0.5)
                    if msg is None:
                        continue
                    msg.ack()  # the held one comes back too, once its lease runs out
                    if msg.id == left.id:
                        back = msg
                stats = second.tracker.stats()
                assert back is not None, f"the copy on the spare was never taken: {stats}"
                assert back.attempt == 2, "the same attempt: the first copy was never delivered"
                assert (back.lane, back.partition) == (1, retry_window[0])
                # A copy is readable before its round commits and counts it.
                wait_until(
                    lambda: second.tracker.stats()["redeliveries:unread"] >= 1,
                    10,
                    "the copy's round to count it",
                )
                assert second.tracker.stats()["watch_replayed"] >= 1
            finally:
                os.kill(idle.pid, signal.SIGKILL)
                if second is not None:
                    second.stop()


def test_a_new_consumer_reads_the_copies_of_a_queue_whose_every_reader_was_killed(
    broker: Broker, children: Children
) -> None:
    """The only worker of a queue holds four messages and is SIGKILLed; a new consumer
    starts right after. Its group waits for the dead member's 15 s session before giving
    it anything, and there is no other member to read the copies. The tracker, hearing no
    reader of the queue, says on the control topic which retry partition the copies are on
    (an ``unread`` notice), and the new consumer, which reads nothing of the queue's retry
    lane yet, reads that partition meanwhile (kmq.adopted). Before that, the copies waited
    for the group's rebalance, 15 s and more after the kill."""
    session_ms = 15_000  # copies are due after the 1 s lease: far sooner than this
    with one_partition_queue(broker, 2, session_ms) as (topics, running, service):
        retry_window = service.write_partitions("jobs", topics.retry)
        worker = owning_worker(broker, topics, children, service, session_ms)
        held, killed_at = kill_holding_four(service, worker)
        got: dict[str, float] = {}
        with service.queue("jobs").consumer(max_in_flight=8) as fresh:
            while len(got) < len(held) and time.monotonic() < killed_at + 40:
                msg = fresh.receive(timeout_s=0.5)
                if msg is not None:
                    assert msg.attempt == 2 and msg.id in held, (msg.id, msg.attempt)
                    assert (msg.lane, msg.partition) == (1, retry_window[0]), msg
                    if not fresh.assignment():  # the group has not settled yet
                        got[msg.id] = time.monotonic() - killed_at
                    msg.ack()
        assert set(got) == held, (
            f"copies taken before the group gave the new consumer anything: {got}"
        )
        assert max(got.values()) < session_ms / 1000, got
        assert running.tracker.stats()["unread_notices"] >= 1
        wait_until(
            lambda: running.tracker.stats()["unread_withdrawn"] >= 1,
            15,
            "the notice to be withdrawn once the new consumer was heard",
        )


def test_a_copy_whose_reader_froze_is_copied_again_to_a_live_one(
    broker: Broker,
    topics: Topics,
    make_service: Callable[..., kmq.Service],
    tracker: Tracker,
    children: Children,
) -> None:
    """A copy goes to the retry partition of a consumer that was live when it was written;
    that consumer then stops (SIGSTOP: it stays in its group until its 30 s session runs
    out). Nobody takes the copy, its partition falls silent, and the tracker copies it
    again to a consumer still heard from, long before the group would move the partition."""
    session_ms = 30_000
    service = make_service(session_timeout_ms=session_ms)
    queue = service.queue("jobs")
    # The worker holds what it takes (keep-alives: it is heard from) and, full, takes no copy.
    worker = holding_worker(broker, topics, children, session_ms)
    with queue.consumer(max_in_flight=8) as consumer:
        wait_for_one_partition_each(service, topics, consumer, worker)
        mine = consumer.assignment()
        producer = queue.producer()
        for i in range(8):  # alternating partitions: four for each member
            producer.send(f"m{i}".encode())
        worker.wait_for('"event": "holding"', 30, count=4)
        taken = [consumer.receive(timeout_s=15) for _ in range(4)]
        assert all(m is not None and m.attempt == 1 for m in taken)
        kept, nacked, *done = [m for m in taken if m is not None]
        for m in done:
            m.ack()
        # `kept` is held (keep-alives: this consumer stays heard from); `nacked` goes back
        # now, and its copy to the retry partition of the worker, the other live reader.
        nacked.nack(delay_s=0, reason="elsewhere, please")
        wait_until(
            lambda: tracker.stats()["redeliveries:nacked"] == 1, 15, "the copy to be written"
        )
        os.kill(worker.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        back = None
        while back is None and time.monotonic() - frozen_at < 15:
            msg = consumer.receive(timeout_s=0.5)
            if msg is None:
                continue
            if msg.id == nacked.id:
                back = msg
            msg.ack()  # the worker's held messages come back too, once their leases run out
        waited_s = time.monotonic() - frozen_at
        os.kill(worker.pid, signal.SIGKILL)
        assert back is not None, "the copy waited for the frozen worker's group session"
        assert back.attempt == 2, "the same attempt: the first copy was never delivered"
        wait_until(  # a copy is readable before its round commits and counts it
            lambda: tracker.stats()["redeliveries:unread"] >= 1, 10, "the copy's round to count it"
        )
        assert consumer.assignment() == mine, "it came before any rebalance"
        assert waited_s < session_ms / 1000 / 2, waited_s
        kept.ack()


def test_the_tracker_hears_which_retry_partitions_a_live_consumer_reads(
    service: kmq.Service, tracker: Tracker
) -> None:
    """A consumer names the retry partitions it reads on its marker records (header
    ``kmq.reads``); the tracker sends copies to those first, and forgets a consumer that
    has stopped writing."""
    queue = service.queue("jobs")
    with queue.consumer() as consumer:
        producer = queue.producer()
        producer.send(b"held")
        msg = consumer.receive(timeout_s=30)
        assert msg is not None
        # Held, the message gets keep-alives every third of its lease: records keep coming.
        wait_until(
            lambda: bool(consumer.retry_assignment())
            and tracker.live_readers("jobs") == consumer.retry_assignment(),
            15,
            "the tracker to hear what the consumer reads",
        )
        assert tracker.live_readers("other") == frozenset()
        msg.ack()
    wait_until(lambda: tracker.live_readers("jobs") == frozenset(), 10, "a closed one forgotten")


def test_the_retry_lane_goes_on_from_where_a_group_member_left_off(
    broker: Broker, topics: Topics, service: kmq.Service
) -> None:
    """Earlier kmq consumers read the retry topic as members of a group of its own,
    ``<queue group>.retry``. A consumer now reads it by assign(), in no group, keeping its
    offsets under that same group id: it starts where those members left off, and its own
    commits land there once they have gone."""
    retry_window = service.write_partitions("jobs", topics.retry)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")

    def copies(value: bytes, count: int) -> list[str]:
        """Copies as the tracker writes them, over the queue's retry window."""
        ids = [new_message_id() for _ in range(count)]
        for i, message_id in enumerate(ids):
            producer.send(topics.retry, key=b"jobs", value=value, partition=retry_window[i % 2],
                          headers=queue_headers(message_id, 2, ()))  # fmt: skip
        producer.flush()
        return ids

    copies(b"taken before the upgrade", 4)
    group = f"kmq.{topics.queue}.jobs.retry"
    old = KafkaConsumer(topics.retry, bootstrap_servers=broker.bootstrap_servers, group_id=group,
                        enable_auto_commit=False, auto_offset_reset="earliest")  # fmt: skip
    taken = 0
    deadline = time.monotonic() + 30
    while taken < 4 and time.monotonic() < deadline:
        taken += sum(map(len, old.poll(timeout_ms=500).values()))
    assert taken == 4, "the old-style member did not read the copies"
    old.commit()
    old.close()  # leaves the group: it has no members now
    fresh = copies(b"after the upgrade", 4)
    received: list[str] = []
    with service.queue("jobs").consumer() as consumer:
        deadline = time.monotonic() + 30
        while len(received) < len(fresh) and time.monotonic() < deadline:
            message = consumer.receive(timeout_s=1)
            if message is not None:
                received.append(message.id)
                message.ack()
        assert consumer.receive(timeout_s=1) is None, "a copy the old member took came again"
    assert sorted(received) == sorted(fresh)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        committed = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    assert {tp.partition: meta.offset for tp, meta in committed.items()
            if tp.topic == topics.retry and tp.partition in retry_window} == {
        p: 4 for p in retry_window
    }, "the consumer's own commits did not land under the old group id"
