"""Cooperative rebalancing: a member joining or leaving a queue's group, or a tracker
replica joining or leaving the trackers' group, does not stop the members already reading."""

from __future__ import annotations

import dataclasses

import kmq
from tests.functional.conftest import RunningTracker
from tests.functional.helpers import wait_until
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
