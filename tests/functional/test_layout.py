"""Where queues live on the queue topic: each group reads only its queue's partitions, a hot
queue grows, and records written under kmq 0.1's everywhere-layout survive the upgrade."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

import kmq
from kmq.cli import main as cli
from kmq.layout import base_partition
from kmq.records import new_message_id, queue_headers
from kmq.topics import ensure_topics
from tests.functional.conftest import Broker
from tests.functional.helpers import read_records, wait_until

PARTITIONS = 4


def queues_apart(count: int, partitions: int = PARTITIONS) -> list[str]:
    """Queue ids whose layout windows (one partition each) do not overlap."""
    found: dict[int, str] = {}
    for i in itertools.count():
        name = f"q{i}"
        found.setdefault(base_partition(name, partitions), name)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("unreachable")


@pytest.fixture
def spread_one(broker: Broker) -> Iterator[kmq.Service]:
    """A service on fresh topics of 4 partitions, one per queue."""
    tag = uuid.uuid4().hex[:10]
    svc = kmq.Service(
        bootstrap_servers=broker.bootstrap_servers,
        queue_topic=f"l{tag}.queue",
        marker_topic=f"l{tag}.markers",
        control_topic=f"l{tag}.control",
        queue_partitions=PARTITIONS,
        queue_spread=1,
        marker_partitions=2,
        redelivery_timeout_s=1.0,
        session_timeout_ms=broker.session_timeout_ms,
    )
    yield svc
    svc.close()


def receive_ids(consumer: kmq.Consumer, count: int, timeout_s: float = 20.0) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.receive_many(50, timeout_s=0.5):
            got.append(message.id)
            message.ack()
    return got


def test_a_queue_lives_on_its_own_partitions_and_its_group_reads_only_those(
    broker: Broker, spread_one: kmq.Service
) -> None:
    a, b = queues_apart(2)
    sent_a = [spread_one.queue(a).producer().send(b"a%d" % i) for i in range(20)]
    sent_b = [spread_one.queue(b).producer().send(b"b%d" % i) for i in range(20)]
    own_a, own_b = spread_one.write_partitions(a), spread_one.write_partitions(b)
    assert len(own_a) == len(own_b) == 1 and own_a != own_b
    records = read_records(broker.bootstrap_servers, spread_one.config.queue_topic)
    by_partition = {(r.key, r.partition) for r in records}
    assert by_partition == {(a.encode(), own_a[0]), (b.encode(), own_b[0])}
    with spread_one.queue(a).consumer() as consumer:
        assert sorted(receive_ids(consumer, 20)) == sorted(sent_a)
        assert consumer.assignment() == frozenset(own_a)  # b's partition is never fetched
        assert consumer.receive(timeout_s=1) is None
    assert set(sent_b).isdisjoint(sent_a)


def test_two_consumers_share_a_queue_spread_over_two_partitions(spread_one: kmq.Service) -> None:
    q = spread_one.queue("shared")
    q.set_spread(2)
    assert len(spread_one.write_partitions("shared")) == 2
    sent = {q.producer().send(b"%d" % i) for i in range(200)}
    got: dict[str, set[str]] = {"c1": set(), "c2": set()}
    with q.consumer() as c1, q.consumer() as c2:
        wait_until(
            lambda: len(c1.assignment()) == len(c2.assignment()) == 1, 30, "one partition each"
        )
        deadline = time.monotonic() + 30
        while len(got["c1"] | got["c2"]) < len(sent) and time.monotonic() < deadline:
            for name, consumer in (("c1", c1), ("c2", c2)):
                for message in consumer.receive_many(50, timeout_s=0.1):
                    got[name].add(message.id)
                    message.ack()
    assert got["c1"] | got["c2"] == sent
    assert got["c1"] and got["c2"], "both consumers did work"


def test_a_hot_queue_grows_its_spread_while_consumed(spread_one: kmq.Service) -> None:
    q = spread_one.queue("hot")
    before = [q.producer().send(b"before-%d" % i) for i in range(10)]
    with q.consumer() as consumer:
        assert sorted(receive_ids(consumer, 10)) == sorted(before)
        assert len(consumer.assignment()) == 1
        q.set_spread(3)
        with pytest.raises(kmq.InvalidArgumentError, match="only grow"):
            q.set_spread(1)
        wait_until(lambda: len(consumer.assignment()) == 3, 30, "the group to read 3 partitions")
        after = [q.producer().send(b"after-%d" % i) for i in range(30)]
        assert sorted(receive_ids(consumer, 30)) == sorted(after)
    partitions = {
        r.partition
        for r in read_records(spread_one.config.bootstrap_servers, spread_one.config.queue_topic)
        if r.value.startswith(b"after-")
    }
    assert partitions == set(spread_one.write_partitions("hot")) and len(partitions) == 3


def colliding(count: int, partitions: int = PARTITIONS) -> list[str]:
    """Queue ids whose hashes all pick the same partition."""
    names = (f"q{i}" for i in itertools.count())
    first = next(names)
    return [first, *itertools.islice(
        (n for n in names if base_partition(n, partitions) == base_partition(first, partitions)),
        count - 1,
    )]  # fmt: skip


def test_declared_queues_get_partitions_of_their_own(broker: Broker) -> None:
    a, b = colliding(2)
    tag = uuid.uuid4().hex[:10]
    settings: dict[str, Any] = {
        "bootstrap_servers": broker.bootstrap_servers,
        "queue_topic": f"p{tag}.queue",
        "marker_topic": f"p{tag}.markers",
        "control_topic": f"p{tag}.control",
        "queue_partitions": PARTITIONS,
        "queue_spread": 2,
        "marker_partitions": 2,
        "session_timeout_ms": broker.session_timeout_ms,
    }
    with kmq.Service(**settings, queues=(a, b)) as declaring, kmq.Service(**settings) as other:
        sent_a = [declaring.queue(a).producer().send(b"a%d" % i) for i in range(20)]
        # A process that declares nothing reads the placement from the control topic.
        sent_b = [other.queue(b).producer().send(b"b%d" % i) for i in range(20)]
        assert declaring.write_partitions(a) == other.write_partitions(a) == (0, 1)
        assert declaring.write_partitions(b) == other.write_partitions(b) == (2, 3)
        retry = declaring.config.retry_topic
        assert other.write_partitions(b, retry) == (2, 3), "the retry topic is placed alike"
        records = read_records(broker.bootstrap_servers, declaring.config.queue_topic)
        assert {(r.key, r.partition) for r in records} == {
            (a.encode(), 0), (a.encode(), 1), (b.encode(), 2), (b.encode(), 3),
        }  # fmt: skip
        with other.queue(b).consumer() as consumer:
            assert sorted(receive_ids(consumer, 20)) == sorted(sent_b)
            assert consumer.assignment() == frozenset({2, 3})  # a's records are never fetched
        with declaring.queue(a).consumer() as consumer:
            assert sorted(receive_ids(consumer, 20)) == sorted(sent_a)
    shown = CliRunner().invoke(
        cli,
        ["topics", "layout", "--bootstrap-servers", broker.bootstrap_servers,
         "--queue-topic", settings["queue_topic"], "--marker-topic", settings["marker_topic"],
         "--control-topic", settings["control_topic"]],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert f"placed queues: {a}@0, {b}@2" in shown.output


def test_records_of_the_old_layout_are_delivered_after_an_upgrade(broker: Broker) -> None:
    """A kmq 0.1 topic (no layout, every queue on every partition) is upgraded in two steps
    while records keep coming: nothing written before, during or after is left behind, and
    once past the old records a group reads only its own partitions."""
    tag = uuid.uuid4().hex[:10]
    config = kmq.ServiceConfig(
        bootstrap_servers=broker.bootstrap_servers,
        queue_topic=f"u{tag}.queue",
        marker_topic=f"u{tag}.markers",
        control_topic=f"u{tag}.control",
        redelivery_timeout_s=1.0,
        session_timeout_ms=broker.session_timeout_ms,
    )
    ensure_topics(  # control and markers topics only: the queue topic predates layouts
        kmq.ServiceConfig(
            bootstrap_servers=broker.bootstrap_servers,
            queue_topic=f"u{tag}.other",
            marker_topic=config.marker_topic,
            control_topic=config.control_topic,
        )
    )
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    admin.create_topics([NewTopic(config.queue_topic, PARTITIONS, 1)])
    admin.close()
    x, y = "x-queue", "y-queue"
    old = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    sent_x: list[str] = []
    for i in range(16):  # kmq 0.1: round-robin over every partition
        queue = x if i % 2 == 0 else y
        message_id = new_message_id()
        if queue == x:
            sent_x.append(message_id)
        old.send(config.queue_topic, key=queue.encode(), value=b"old",
                 headers=queue_headers(message_id, 1, ()), partition=i % PARTITIONS)  # fmt: skip
    old.flush()
    connection = ["--bootstrap-servers", broker.bootstrap_servers,
                  "--queue-topic", config.queue_topic, "--marker-topic", config.marker_topic,
                  "--control-topic", config.control_topic]  # fmt: skip
    runner = CliRunner()
    shown = runner.invoke(cli, ["topics", "layout", *connection])
    assert shown.exit_code == 0 and "no layout" in shown.output, shown.output
    step1 = runner.invoke(cli, ["topics", "layout", "--spread", "1", *connection])
    assert step1.exit_code == 0 and "may still be written" in step1.output, step1.output
    with kmq.Service(config) as svc:
        wait_until(lambda: svc.layout() is not None, 10, "the layout to be visible")
        own = svc.write_partitions(x)
        sent_x += [svc.queue(x).producer().send(b"between") for _ in range(4)]
        # a last straggler from a 0.1 process, on a partition that is not x's
        other = next(p for p in range(PARTITIONS) if p not in own)
        straggler = new_message_id()
        old.send(config.queue_topic, key=x.encode(), value=b"late 0.1",
                 headers=queue_headers(straggler, 1, ()), partition=other).get(10)  # fmt: skip
        sent_x.append(straggler)
        step2 = runner.invoke(cli, ["topics", "finish-upgrade", *connection])
        assert step2.exit_code == 0 and "old-layout records end at" in step2.output, step2.output
        wait_until(lambda: getattr(svc.layout(), "legacy_end", None) is not None, 10,
                   "the finished upgrade to be visible")  # fmt: skip
        sent_x += [svc.queue(x).producer().send(b"after") for _ in range(4)]
        with svc.queue(x).consumer() as consumer:
            assert sorted(receive_ids(consumer, len(sent_x), 30)) == sorted(sent_x)
            assert consumer.receive(timeout_s=1) is None
            wait_until(lambda: consumer.fetching() == frozenset(own), 10,
                       "the consumer to stop fetching other queues' partitions")  # fmt: skip
        with svc.queue(x).consumer() as again:
            wait_until(lambda: again.assignment(), 30, "the group to settle")
            assert again.assignment() == frozenset(own), "past the old records: own ones only"
            assert again.receive(timeout_s=1) is None
    old.close()
