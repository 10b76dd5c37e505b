"""``kmq status`` against a known workload: 12 sent, 2 acked, 1 rejected (dead-lettered), 4
held in flight by a live consumer, 5 never taken."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import kmq
from kmq import kafka_clients
from kmq.cli import main
from tests.functional.conftest import Broker, Topics
from tests.functional.helpers import wait_until
from tracker.daemon import Tracker

SENT = 12
MAX_IN_FLIGHT = 4


def _committed_total(bootstrap: str, group: str) -> int:
    admin = kafka_clients.admin(kafka_clients.connection(bootstrap))
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    return sum(meta.offset for meta in offsets.values() if meta.offset > 0)


@pytest.fixture
def workload(
    make_service: Callable[..., kmq.Service], tracker: Tracker, topics: Topics
) -> Iterator[kmq.Service]:
    svc = make_service(redelivery_timeout_s=120.0)  # held messages stay in flight
    queue = svc.queue("jobs")
    producer = queue.producer()
    for i in range(SENT):
        producer.send(b"job %d" % i)
    with queue.consumer(max_in_flight=MAX_IN_FLIGHT) as consumer:
        taken: list[kmq.Message] = []

        def take() -> bool:
            taken.extend(consumer.receive_many(MAX_IN_FLIGHT - len(taken), 0.2))
            return len(taken) == MAX_IN_FLIGHT

        wait_until(take, 30, "the first messages")
        taken[0].ack()
        taken[1].ack()
        taken[2].reject("bad job")  # the consumer writes the dead letter before it returns
        # taken[3] stays in flight; the consumer takes 3 more (its room) and holds them.
        group = f"kmq.{topics.queue}.jobs"
        wait_until(
            lambda: _committed_total(svc.config.bootstrap_servers, group) == MAX_IN_FLIGHT + 3,
            30,
            "the consumer to take its room's worth",
        )
        yield svc


def _status(bootstrap: str, topics: Topics, group: str, *args: str) -> Any:
    argv = [
        "status",
        "--bootstrap-servers", bootstrap,
        "--queue-topic", topics.queue,
        "--marker-topic", topics.markers,
        "--control-topic", topics.control,
        "--tracker-group", group,
        "--timeout-s", "20",
        *args,
    ]  # fmt: skip
    return CliRunner().invoke(main, argv)


def test_status_shows_backlog_in_flight_dead_letters_and_pause(
    workload: kmq.Service, topics: Topics, tracker: Tracker
) -> None:
    bootstrap = workload.config.bootstrap_servers
    group = tracker.config.group_id
    result = _status(bootstrap, topics, group, "--json", "jobs")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    (jobs,) = report["queues"]
    assert jobs["queue"] == "jobs"
    assert jobs["backlog_records"] == SENT - MAX_IN_FLIGHT - 3
    assert jobs["in_flight"] == MAX_IN_FLIGHT
    assert 0 <= jobs["oldest_in_flight_age_s"] < 120
    assert jobs["dead_letters"] == 1
    assert jobs["dead_letter_queue"] == "jobs.dlq"
    assert jobs["redeliveries"] == 0
    assert jobs["paused_until_ms"] == 0
    assert jobs["exact"] is True
    assert report["unattributed_in_flight"] == 0
    assert report["tracker"]["group_id"] == group
    assert len(report["tracker"]["members"]) == 1
    assert report["tracker"]["state"] == "Stable"

    # Every queue with a consumer group is listed without naming it.
    result = _status(bootstrap, topics, group, "--json")
    assert [q["queue"] for q in json.loads(result.output)["queues"]] == ["jobs"]

    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    workload.queue("jobs").pause(until)
    result = _status(bootstrap, topics, group, "--watch", "--interval", "0.1",
                     "--refreshes", "2", "jobs")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.count("tracker group") == 2
    row = next(line for line in result.output.splitlines() if line.startswith("jobs "))
    assert row.split()[:6] == ["jobs", "5", "4", row.split()[3], "0", "1"]
    assert until.isoformat(timespec="seconds") in row


def test_status_of_an_unknown_queue_is_a_clear_error(
    workload: kmq.Service, topics: Topics, tracker: Tracker
) -> None:
    result = _status(workload.config.bootstrap_servers, topics, tracker.config.group_id, "nope")
    assert result.exit_code == 1
    assert "unknown queue 'nope'" in result.output
    assert "Traceback" not in result.output
    missing = Topics("nosuch.queue", topics.markers, topics.control)
    result = _status(workload.config.bootstrap_servers, missing, tracker.config.group_id)
    assert result.exit_code == 1
    assert result.output == "Error: topic nosuch.queue does not exist (wrong topic option?)\n"


def test_status_counts_the_retry_lane_in_backlog_and_redeliveries(
    service: kmq.Service, topics: Topics, tracker: Tracker
) -> None:
    queue = service.queue("mail")
    producer = queue.producer()
    for i in range(5):
        producer.send(b"mail %d" % i)
    with queue.consumer(max_in_flight=2) as consumer:
        taken: list[kmq.Message] = []

        def take() -> bool:
            taken.extend(consumer.receive_many(2 - len(taken), 0.2))
            return len(taken) == 2

        wait_until(take, 30, "two messages")
    # Closing released both: the tracker copies them to the retry topic, where no one reads.
    wait_until(lambda: tracker.stats()["redeliveries"] == 2, 30, "the two copies")
    result = _status(service.config.bootstrap_servers, topics, tracker.config.group_id, "--json")
    assert result.exit_code == 0, result.output
    (mail,) = json.loads(result.output)["queues"]
    assert (mail["queue"], mail["backlog_records"], mail["redeliveries"]) == ("mail", 5, 2)
    assert (mail["in_flight"], mail["oldest_in_flight_age_s"], mail["exact"]) == (0, None, True)


def test_status_of_fresh_topics_without_a_tracker(broker: Broker, topics: Topics) -> None:
    result = _status(broker.bootstrap_servers, topics, "no-tracker-here")
    assert result.exit_code == 0, result.output
    assert "no queues found" in result.output
    assert "tracker group no-tracker-here" in result.output
    assert ": 0 replicas" in result.output
