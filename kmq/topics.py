"""Creating kmq's topics when they are missing, and reading a topic's partition ends."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from kmq import kafka_clients
from kmq.config import ServiceConfig
from kmq.control import set_layout
from kmq.errors import BrokerError
from kmq.kafka_clients import KafkaConnection
from kmq.layout import TopicLayout, place

log = logging.getLogger(__name__)


def ensure_topics(config: ServiceConfig, *, timeout_s: float = 30.0) -> list[str]:
    """Create the control, queue, retry and markers topics if absent; return the names it
    created.

    Existing topics are left as they are, whatever their partition count. A queue or retry
    topic kmq creates gets its layout record (one window of ``queue_spread`` partitions per
    queue, those of ``config.queues`` placed apart) written *before* the topic exists, so no
    process can see the topic without its layout.
    """
    conn = config.connection
    admin = kafka_clients.admin(conn)
    created: list[str] = []
    try:
        existing = set(admin.list_topics())
        deadline = time.monotonic() + timeout_s
        if config.control_topic not in existing:
            compact = {"cleanup.policy": "compact"}
            if _create(admin, NewTopic(config.control_topic, 1, config.replication_factor,
                                       topic_configs=compact)):  # fmt: skip
                created.append(config.control_topic)
            _wait_visible(admin, [config.control_topic], deadline)
        for name in (config.queue_topic, config.retry_topic):
            if name not in existing:
                set_layout(
                    conn,
                    config.control_topic,
                    name,
                    TopicLayout(
                        config.queue_partitions,
                        config.queue_spread,
                        legacy_end={},
                        placed=place(config.queue_partitions, config.queue_spread, config.queues),
                    ),
                )
        for name, partitions in (
            (config.queue_topic, config.queue_partitions),
            (config.retry_topic, config.queue_partitions),
            (config.marker_topic, config.marker_partitions),
        ):
            if name not in existing and _create(
                admin, NewTopic(name, partitions, config.replication_factor)
            ):
                created.append(name)
        _wait_visible(admin, created, deadline)
    except KafkaError as exc:
        raise BrokerError(f"creating topics failed: {exc}") from exc
    finally:
        admin.close()
    return created


def _create(admin: KafkaAdminClient, topic: NewTopic) -> bool:
    try:
        admin.create_topics([topic])
    except TopicAlreadyExistsError:
        return False
    log.info("created topic %s with %d partitions", topic.name, topic.num_partitions)
    return True


def _wait_visible(admin: KafkaAdminClient, names: list[str], deadline: float) -> None:
    while names and not set(names) <= set(admin.list_topics()):
        if time.monotonic() > deadline:
            raise BrokerError(f"topics {names} were created but never became visible")
        time.sleep(0.05)


def high_watermarks(
    conn: KafkaConnection | str, tps: Iterable[TopicPartition], timeout_s: float = 30.0
) -> dict[TopicPartition, int]:
    """Each partition's high watermark, read from fetch responses: ListOffsets(latest)
    (``end_offsets()``) answers wrongly on some brokers (the embedded Tansu among them)."""
    wanted = list(tps)
    consumer = kafka_clients.consumer(
        kafka_clients.connection(conn), "offsets", enable_auto_commit=False, fetch_max_wait_ms=50
    )
    try:
        consumer.assign(wanted)
        consumer.seek_to_beginning(*wanted)
        found: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(found) < len(wanted):
            if time.monotonic() > deadline:
                missing = sorted(str(tp) for tp in wanted if tp not in found)
                raise BrokerError(f"no high watermark for {missing} in {timeout_s:g} s")
            consumer.poll(timeout_ms=100, max_records=1)
            for tp in wanted:
                hw = consumer.highwater(tp)
                if hw is not None:
                    found[tp] = hw
                    consumer.pause(tp)
        return found
    except KafkaError as exc:
        raise BrokerError(f"reading high watermarks failed: {exc}") from exc
    finally:
        consumer.close()


def give_layout(config: ServiceConfig, spread: int) -> TopicLayout:
    """Upgrading from kmq 0.1, step 1: give the queue topic a layout (``spread`` partitions
    per queue). New records go to their queue's partitions from then on; every group keeps
    reading every partition, since records of the old layout may still be written."""
    from kmq.control import read_control

    table = read_control(config.connection, config.control_topic)
    current = table.layout(config.queue_topic)
    if current is not None:
        raise BrokerError(f"{config.queue_topic} already has a layout: {current}")
    partitions = _partition_count(config)
    layout = TopicLayout(partitions, min(spread, partitions), legacy_end=None)
    set_layout(config.connection, config.control_topic, config.queue_topic, layout)
    return layout


def finish_upgrade(config: ServiceConfig) -> TopicLayout:
    """Upgrading from kmq 0.1, step 2, once no process of 0.1 writes to the topic any more:
    records of the old layout now end at today's partition ends, so each group reads the
    partitions that are not its queue's up to there, and then never again."""
    from kmq.control import read_control

    table = read_control(config.connection, config.control_topic)
    current = table.layout(config.queue_topic)
    if current is None:
        raise BrokerError(f"{config.queue_topic} has no layout yet: run `kmq topics layout` first")
    if current.legacy_end is not None:
        return current
    partitions = _partition_count(config)
    ends = high_watermarks(
        config.connection,
        [TopicPartition(config.queue_topic, p) for p in range(partitions)],
    )
    layout = TopicLayout(
        current.partitions,
        current.spread,
        current.queues,
        legacy_end={tp.partition: end for tp, end in ends.items() if end > 0},
    )
    set_layout(config.connection, config.control_topic, config.queue_topic, layout)
    return layout


def _partition_count(config: ServiceConfig) -> int:
    consumer = kafka_clients.consumer(config.connection, "topics")
    try:
        partitions = consumer.partitions_for_topic(config.queue_topic)
    finally:
        consumer.close()
    if not partitions:
        raise BrokerError(f"topic {config.queue_topic} does not exist")
    return len(partitions)
