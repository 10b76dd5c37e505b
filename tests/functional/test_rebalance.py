"""Cooperative rebalancing: a member joining or leaving a queue's group, or a tracker
replica joining or leaving the trackers' group, does not stop the members already reading."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import kmq
from tests.functional.conftest import Broker, RunningTracker
from tests.functional.helpers import wait_until
from tracker.config import TrackerConfig

PARTITIONS = 4
MARKER_PARTITIONS = 2  # the topics fixture's
EVERY = frozenset(range(PARTITIONS))


@pytest.fixture
def svc(broker: Broker) -> Iterator[kmq.Service]:
    tag = uuid.uuid4().hex[:10]
    service = kmq.Service(
        bootstrap_servers=broker.bootstrap_servers,
        queue_topic=f"rb{tag}.queue",
        marker_topic=f"rb{tag}.markers",
        control_topic=f"rb{tag}.control",
        queue_partitions=PARTITIONS,
        queue_spread=PARTITIONS,
        marker_partitions=2,
        redelivery_timeout_s=1.0,
        session_timeout_ms=broker.session_timeout_ms,
    )
    yield service
    service.close()


def test_a_member_joining_and_leaving_does_not_stop_the_one_reading(svc: kmq.Service) -> None:
    queue = svc.queue("jobs")
    first = queue.consumer()
    try:
        wait_until(lambda: first.assignment() == EVERY, 30, "the first member to own everything")
        assert first.partitions_given_up == 0
        second = queue.consumer()
        try:
            wait_until(
                lambda: second.assignment()
                and first.assignment() | second.assignment() == EVERY
                and not first.assignment() & second.assignment(),
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
    first = RunningTracker(tracker_config)
    try:
        everything = list(range(MARKER_PARTITIONS))
        wait_until(lambda: first.tracker.partitions() == everything, 30, "one replica owning all")
        second = RunningTracker(tracker_config)
        try:
            wait_until(
                lambda: second.tracker.partitions()
                and sorted(first.tracker.partitions() + second.tracker.partitions())
                == everything,
                30,
                "the markers partitions to be shared between both replicas",
            )
            moved = len(second.tracker.partitions())
            assert first.tracker.stats()["partitions_revoked"] == moved < MARKER_PARTITIONS
        finally:
            second.stop()
        wait_until(lambda: first.tracker.partitions() == everything, 30, "all back to the first")
        assert first.tracker.stats()["partitions_revoked"] == moved
    finally:
        first.stop()
