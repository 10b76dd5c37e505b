"""The Kafka side of the DataSource: offset bounds, reading one offset range, a bulk producer.

No consumer groups anywhere: readers ``assign()`` and ``seek()``. High watermarks come from
fetch responses, never from ``end_offsets()`` (which some Kafka-protocol brokers, Tansu 0.6
among them, answer with stale values); that is correct on Apache Kafka as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import CorruptRecordError, KafkaError

from kmq import kafka_clients
from kmq.errors import BrokerError
from kmq.kafka_clients import KafkaConnection, KafkaSecurity
from kmq.record_v2 import records
from kmq.spark.splits import OffsetRange
from kmq.unpack import Records

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
_POLL_BATCHES = 1_000


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


class RecordRun:
    """Records of a read, one list per field (no object per record): what the column
    builders (kmq.spark.columns) take. ``headers`` is None when the reader did not ask for
    them."""

    __slots__ = ("headers", "keys", "offsets", "partitions", "timestamps", "values")

    def __init__(self, *, with_headers: bool = True) -> None:
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes | None]]] | None = [] if with_headers else None

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def of(cls, records: Any) -> RecordRun:
        """A run of kafka-python-like records (``partition``, ``offset``, ``timestamp``,
        ``key``, ``value``, ``headers`` attributes)."""
        run = cls()
        run.partitions = [r.partition for r in records]
        run.offsets = [r.offset for r in records]
        run.timestamps = [r.timestamp for r in records]
        run.keys = [r.key for r in records]
        run.values = [r.value for r in records]
        run.headers = [r.headers for r in records]
        return run

    def add_batch(self, partition: int, batch: Any, lo: int, hi: int) -> None:
        """Append the records of one kafka-python record batch whose offsets are in
        ``[lo, hi)``."""
        if batch.magic < 2:
            for r in batch.records:
                if lo <= r.offset < hi:
                    self.partitions.append(partition)
                    self.offsets.append(r.offset)
                    self.timestamps.append(r.timestamp)
                    self.keys.append(r.key)
                    self.values.append(r.value)
                    if self.headers is not None:
                        self.headers.append(list(r.headers))
            return
        if batch.base_offset >= hi or batch.last_offset < lo:
            return
        before = len(self.offsets)
        _decode_v2(batch, lo, hi, self)
        self.partitions.extend([partition] * (len(self.offsets) - before))


def _decode_v2(batch: Any, lo: int, hi: int, run: RecordRun) -> None:
    """Append the records of a message format v2 batch in ``[lo, hi)`` to ``run``, one list
    per field (no object per record)."""
    wanted: Callable[[], range] | None = None
    if batch.base_offset < lo or batch.last_offset >= hi:  # a batch at an edge of the range
        within = range(lo, hi)
        wanted = lambda: within  # noqa: E731
    add_offset, add_ts = run.offsets.append, run.timestamps.append
    add_key, add_value = run.keys.append, run.values.append
    add_headers = run.headers.append if run.headers is not None else None
    for offset, timestamp, key, value, headers in records(batch, wanted):
        add_offset(offset)
        add_ts(timestamp)
        add_key(key)
        add_value(value)
        if add_headers is not None:
            add_headers(headers)


class _Legacy:
    """The records of a message format v0/v1 batch (one wrapper message), read as usual."""

    magic = 1

    def __init__(self, records: list[Any]) -> None:
        self.records = records
        self.last_offset: int = records[-1].offset


class _WholeBatches(Records):
    """kafka-python's fetched partition data handing each record batch over whole, instead of
    a ConsumerRecord per record: ``poll()`` then returns batches (``max_records`` counts
    batches), which :meth:`RecordRun.add_batch` decodes. The batch-level work (CRC checks,
    aborted transactions, control batches, positions) is :class:`kmq.unpack.Records`'s."""

    def _maybe_skip_record(self, batch: Any) -> bool:
        return bool(batch.last_offset < self.fetch_offset)

    def _batch(self, tp: Any, batch: Any, key_deserializer: Any, value_deserializer: Any
               ) -> Iterator[Any]:  # fmt: skip
        self.next_fetch_offset = batch.next_offset
        yield batch

    def _legacy(self, tp: Any, batch: Any, key_deserializer: Any, value_deserializer: Any
                ) -> Iterator[Any]:  # fmt: skip
        legacy = []
        for record in batch:
            if self.check_crcs and not record.validate_crc():
                raise CorruptRecordError(
                    f"Record for partition {tp} at offset {record.offset} failed crc check"
                )
            legacy.append(record)
        if legacy:
            self.next_fetch_offset = legacy[-1].offset + 1
            yield _Legacy(legacy)


def read_range(
    bootstrap_servers: str,
    rng: OffsetRange,
    settings: Mapping[str, Any] | None = None,
    idle_timeout_ms: int = 30_000,
    *,
    with_headers: bool = True,
) -> Iterator[RecordRun]:
    """Yield the records of ``rng`` in offset order, a run per fetch."""
    if rng.size == 0:
        return
    consumer = open_consumer(bootstrap_servers, settings or {})
    # Whole batches from the fetcher, decoded here: kafka-python's record objects cost
    # more than everything else a read does.
    consumer._fetcher.PartitionRecords = _WholeBatches
    tp = TopicPartition(rng.topic, rng.partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, rng.start)
        last_progress = time.monotonic()
        while True:
            batches = consumer.poll(timeout_ms=_POLL_MS, max_records=_POLL_BATCHES).get(tp)
            now = time.monotonic()
            if batches:
                last_progress = now
                run = RecordRun(with_headers=with_headers)
                for batch in batches:
                    run.add_batch(rng.partition, batch, rng.start, rng.end)
                if len(run):
                    yield run
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
