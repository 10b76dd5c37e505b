"""Rebalancing: a member joining or leaving a queue's group, or a tracker replica joining,
leaving or freezing in the trackers' group, does not stop the members already reading."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import kmq
from kmq.dev.embedded import free_port
from kmq.marker_writer import marker_partition
from tests.functional.conftest import RunningTracker, tracker_argv
from tests.functional.helpers import Children, get, parse_metrics, total, wait_until
from tracker.config import TrackerConfig

PARTITIONS = 2  # the topics fixture's queue and markers topics; a queue's window is both
EVERY = frozenset(range(PARTITIONS))


def test_a_member_joining_and_leaving_does_not_stop_the_one_reading(
    service: kmq.Service,
) -> None:
    queue = service.queue("jobs")
    first = queue.consumer()
    try:
        wait_until(lambda: first.assignment() == EVERY, 30, "the first member to own everything")
        assert first.partitions_given_up == 0
        second = queue.consumer()
        try:
            wait_until(
                lambda: (
                    second.assignment()
                    and first.assignment() | second.assignment() == EVERY
                    and not first.assignment() & second.assignment()
                ),
                30,
                "the partitions to be shared between both members",
            )
            moved = len(second.assignment())
            # Only what moved to the newcomer was given up; eager rebalancing would have
            # given up all four and taken back the ones it kept.
            assert first.partitions_given_up == moved < PARTITIONS
        finally:
            second.close()  # leaves the group: its partitions come back to the first
        wait_until(lambda: first.assignment() == EVERY, 30, "the first member to own all again")
        assert first.partitions_given_up == moved, "taking partitions back gives up none"
    finally:
        first.close()


def test_a_tracker_replica_joining_and_leaving_moves_only_what_it_must(
    tracker_config: TrackerConfig,
) -> None:
    tracker_config = dataclasses.replace(tracker_config, rebalance="cooperative")
    first = RunningTracker(tracker_config)
    try:
        everything = list(range(PARTITIONS))
        wait_until(lambda: first.tracker.partitions() == everything, 30, "one replica owning all")
        second = RunningTracker(tracker_config)
        try:
            wait_until(
                lambda: (
                    second.tracker.partitions()
                    and sorted(first.tracker.partitions() + second.tracker.partitions())
                    == everything
                ),
                30,
                "the markers partitions to be shared between both replicas",
            )
            moved = len(second.tracker.partitions())
            assert first.tracker.stats()["partitions_revoked"] == moved < PARTITIONS
        finally:
            second.stop()
        wait_until(lambda: first.tracker.partitions() == everything, 30, "all back to the first")
        assert first.tracker.stats()["partitions_revoked"] == moved
    finally:
        first.stop()


def test_a_tracker_replica_goes_on_redelivering_while_the_group_rebalances(
    service: kmq.Service, tracker_config: TrackerConfig, children: Children
) -> None:
    """An eager rebalance takes every markers partition from every replica, and it can wait
    a session timeout for a dead member. Here a replica is frozen and another joins: the
    replica already there reads the nacks on its partition and redelivers them while the
    group still rebalances, because a replica given one of its partitions claims it only
    once it has let go (README, Handoff): no claim meets one of its commits, and it is
    never fenced. Once the group has settled, every nacked message is redelivered.

    The embedded broker ends such a rebalance about a second after the join, whatever the
    frozen member's session, and the copies come back half a second after their nacks: a
    race that a loaded machine lost once in a fresh clone. So a round whose copies came
    back only after the group had settled tells nothing, and is staged again with the next
    batch of held messages and another joining replica, up to three times."""
    first = RunningTracker(tracker_config)
    extra: list[RunningTracker] = []
    try:
        wait_until(lambda: first.tracker.partitions() == [0, 1], 30, "one replica owning both")
        port = free_port()
        slow = dataclasses.replace(tracker_config, session_timeout_ms=10_000)
        frozen = children.python("tracker-frozen", *tracker_argv(slow, port))

        def shared() -> bool:
            status, body = get(port, "/metrics")
            theirs = total(parse_metrics(body), "kmq_tracker_partitions_assigned")
            view = first.tracker.view()
            return status == 200 and theirs == 1 and len(view.partitions) == 1

        wait_until(shared, 30, "each replica to own one markers partition")
        wait_until(lambda: first.tracker.view().group_stable, 10, "the group to settle")
        [mine] = first.tracker.partitions()

        q = service.queue("jobs")
        producer = q.producer()
        sent: list[str] = []
        while sum(marker_partition(m, PARTITIONS) == mine for m in sent) < 3 * 4:
            sent.append(producer.send(b"%d" % len(sent)))
        ours = [m for m in sent if marker_partition(m, PARTITIONS) == mine]
        batches = [set(ours[i::3]) for i in range(3)]
        outcomes: list[str] = []
        with q.consumer(max_in_flight=len(sent) + 16) as consumer:  # above the retry reserve
            held: dict[str, kmq.Message] = {}
            deadline = time.monotonic() + 30
            while len(held) < len(sent) and time.monotonic() < deadline:
                msg = consumer.receive(timeout_s=0.2)
                if msg is not None:
                    held[msg.id] = msg
            assert set(held) == set(sent)
            os.kill(frozen.pid, signal.SIGSTOP)
            for batch in batches:
                began = time.monotonic()
                extra.append(RunningTracker(tracker_config))  # its join starts a rebalance
                wait_until(lambda: not first.tracker.view().group_stable, 20, "the rebalance")
                for message_id in batch:
                    held.pop(message_id).nack(delay_s=0)
                copies: set[str] = set()
                stable_then: bool | None = None
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    msg = consumer.receive(timeout_s=0.2)
                    if msg is not None:
                        assert msg.attempt > 1, "only copies are left to take"
                        copies.add(msg.id)
                        msg.ack()
                    if batch <= copies:
                        stable_then = first.tracker.view().group_stable
                        break
                assert batch <= copies, "this replica's partition's nacked messages came back"
                outcomes.append(
                    f"{'after' if stable_then else 'during'} the rebalance, "
                    f"{time.monotonic() - began:.1f} s after the join began"
                )
                wait_until(lambda: first.tracker.view().group_stable, 30, "the group to settle")
                if not stable_then:
                    break
            assert outcomes[-1].startswith("during"), f"copies came back: {outcomes}"
            assert first.tracker.stats()["rebalance_held"] == 0
            for msg in held.values():
                msg.ack()
            nacked = sum(map(len, batches[: len(outcomes)]))
            replicas = [first, *extra]
            wait_until(
                lambda: sum(r.tracker.stats()["redeliveries"] for r in replicas) >= nacked,
                20,
                "every nacked message to be redelivered once the group has settled",
            )
            assert first.tracker.stats()["fenced"] == 0, "no claim met this replica's rounds"
    finally:
        for running in extra:
            running.stop()
        first.stop()
