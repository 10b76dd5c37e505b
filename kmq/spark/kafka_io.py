"""The Kafka side of the DataSource: offset bounds, reading one offset range, a bulk producer.

No consumer groups anywhere: readers ``assign()`` and ``seek()``. High watermarks come from
fetch responses, never from ``end_offsets()`` (which some Kafka-protocol brokers, Tansu 0.6
among them, answer with stale values); that is correct on Apache Kafka as well.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Mapping
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from kmq import kafka_clients
from kmq.errors import BrokerError
from kmq.kafka_clients import KafkaConnection, KafkaSecurity
from kmq.spark.splits import OffsetRange

_READ_DEFAULTS: dict[str, Any] = {
    "client_id": "kmq-spark",
    "group_id": None,
    "enable_auto_commit": False,
    "auto_offset_reset": "earliest",
    "fetch_max_wait_ms": 100,
    "max_partition_fetch_bytes": 8 << 20,
    "fetch_max_bytes": 64 << 20,
}

_POLL_MS = 200
_POLL_RECORDS = 50_000


def _only_known(settings: Mapping[str, Any], known: Mapping[str, Any]) -> dict[str, Any]:
    # kafka.* options are shared by readers and writers; each client takes the ones it knows.
    return {k: v for k, v in settings.items() if k in known}


def spark_connection(
    bootstrap_servers: str, settings: Mapping[str, Any]
) -> tuple[KafkaConnection, dict[str, Any]]:
    """The ``kafka.*`` settings as a checked connection (their security settings) and the
    remaining kafka-python settings."""
    security, rest = KafkaSecurity.from_settings(settings)
    return KafkaConnection(bootstrap_servers, security, client_id="kmq-spark"), rest


def open_consumer(
    bootstrap_servers: str, settings: Mapping[str, Any], **overrides: Any
) -> KafkaConsumer:
    """A group-less consumer with read-friendly defaults, ``settings`` and ``overrides``."""
    conn, rest = spark_connection(bootstrap_servers, settings)
    config = {**_READ_DEFAULTS, **_only_known(rest, KafkaConsumer.DEFAULT_CONFIG), **overrides}
    return kafka_clients.consumer(conn, **config)


def open_producer(
    bootstrap_servers: str, settings: Mapping[str, Any], max_request_size: int
) -> KafkaProducer:
    """An idempotent ``acks=all`` producer tuned for bulk writes."""
    conn, rest = spark_connection(bootstrap_servers, settings)
    config: dict[str, Any] = {
        "client_id": "kmq-spark-writer",
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 20,
        "batch_size": 512 * 1024,
        "max_request_size": max_request_size,
        **_only_known(rest, KafkaProducer.DEFAULT_CONFIG),
    }
    return kafka_clients.producer(conn, **config)


def partition_bounds(
    bootstrap_servers: str,
    topic: str,
    settings: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> dict[int, tuple[int, int]]:
    """Each partition's ``(log start offset, high watermark)`` as of now."""
    consumer = open_consumer(
        bootstrap_servers,
        settings or {},
        max_partition_fetch_bytes=64 * 1024,
        fetch_max_wait_ms=10,
    )
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise BrokerError(f"topic {topic!r} does not exist on {bootstrap_servers}")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        low: dict[TopicPartition, int] = consumer.beginning_offsets(tps)
        # Only a starting point close to the end, so the fetches below stay small.
        guess: dict[TopicPartition, int] = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(low[tp], guess.get(tp, low[tp])))
        deadline = time.monotonic() + timeout_s
        while any(consumer.highwater(tp) is None for tp in tps):
            if time.monotonic() > deadline:
                raise BrokerError(f"no fetch response for {topic} within {timeout_s:g} s")
            consumer.poll(timeout_ms=50, max_records=_POLL_RECORDS)
        return {tp.partition: (low[tp], int(consumer.highwater(tp))) for tp in tps}
    except KafkaError as exc:
        raise BrokerError(f"reading offsets of {topic!r} failed: {exc}") from exc
    finally:
        consumer.close(autocommit=False)


def read_range(
    bootstrap_servers: str,
    rng: OffsetRange,
    settings: Mapping[str, Any] | None = None,
    idle_timeout_ms: int = 30_000,
) -> Iterator[list[Any]]:
    """Yield the records of ``rng`` in offset order, in batches (kafka-python records)."""
    if rng.size == 0:
        return
    consumer = open_consumer(bootstrap_servers, settings or {})
    tp = TopicPartition(rng.topic, rng.partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, rng.start)
        last_progress = time.monotonic()
        while True:
            # Never ask for records past the range: kafka-python decodes all it returns.
            wanted = max(1, min(_POLL_RECORDS, rng.end - consumer.position(tp)))
            batch = consumer.poll(timeout_ms=_POLL_MS, max_records=wanted).get(tp)
            now = time.monotonic()
            if batch:
                last_progress = now
                if batch[-1].offset >= rng.end:
                    batch = batch[: bisect.bisect_left(batch, rng.end, key=lambda r: r.offset)]
                if batch:
                    yield batch
                if batch and batch[-1].offset >= rng.end - 1:
                    return
            if consumer.position(tp) >= rng.end:
                return
            if (now - last_progress) * 1000 > idle_timeout_ms:
                raise BrokerError(
                    f"{rng.topic}[{rng.partition}]: no records for {idle_timeout_ms} ms at "
                    f"offset {consumer.position(tp)}, expected up to {rng.end}"
                )
    except KafkaError as exc:
        raise BrokerError(f"reading {rng.topic}[{rng.partition}] failed: {exc}") from exc
    finally:
        consumer.close(autocommit=False)
