"""``format("kmq")``: kmq's queue and markers topics as Spark DataFrames, through Spark 4's
Python Data Source API (no Kafka connector jars needed).

Reading plans one or more splits per Kafka partition, up to the high watermark seen when
the query is planned (or ``end_offsets``). Writing enqueues each row like ``send()`` does.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    MapType,
    Row,
    StringType,
    StructType,
)

from kmq.config import ServiceConfig
from kmq.errors import BrokerError, ConfigError, MessageTooLargeError
from kmq.layout import TopicLayout, write_partitions
from kmq.records import new_message_id, queue_headers, record_size
from kmq.spark.columns import MarkerColumns, QueueColumns
from kmq.spark.kafka_io import open_producer, partition_bounds, read_range, spark_connection
from kmq.spark.options import ReadOptions, WriteOptions
from kmq.spark.schemas import SCHEMAS, check_requested
from kmq.spark.splits import OffsetRange, ranges_to_read, split_ranges
from kmq.validation import check_headers, check_payload, check_queue_id

log = logging.getLogger(__name__)

_HEADER_COLUMNS = {"message_id", "attempt", "dead_letter_origin", "headers"}
"""Queue columns read from record headers (only reads that need them decode headers)."""
_SLACK_BYTES = 4096  # as in kmq.producer: far enough under the limit, no exact size needed


class KmqDataSource(DataSource):
    """``spark.read.format("kmq")``, ``spark.readStream.format("kmq")`` (kmq.spark.stream)
    and ``df.write.format("kmq")``.

    Read options: ``kind`` (``queue`` or ``markers``), ``bootstrap_servers``, ``topic``
    (default ``kmq.queue`` / ``kmq.markers``), ``queue`` (one logical queue only),
    ``max_records_per_split``, ``start_offsets`` / ``end_offsets`` (JSON, partition to
    offset), ``kafka.<setting>`` for kafka-python; streaming adds ``starting_offsets`` and
    ``max_records_per_trigger``. Write options: ``bootstrap_servers``,
    ``topic``, ``marker_topic``, ``queue``, ``create_topics``, ``max_message_bytes``.
    """

    @classmethod
    def name(cls) -> str:
        return "kmq"

    def schema(self) -> StructType:
        return SCHEMAS[ReadOptions.parse(self.options).kind]

    def reader(self, schema: StructType) -> DataSourceReader:
        options = ReadOptions.parse(self.options)
        check_requested(options.kind, schema)
        return KmqReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from kmq.spark.stream import KmqStreamReader, StreamOptions

        options = ReadOptions.parse(self.options)
        check_requested(options.kind, schema)
        return KmqStreamReader(options, StreamOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError("a kmq queue is append-only: use mode('append')")
        options = WriteOptions.parse(self.options)
        check_write_schema(schema, has_queue_option=options.queue is not None)
        conn, _ = spark_connection(options.bootstrap_servers, dict(options.kafka))
        if options.create_topics:
            from kmq.topics import ensure_topics

            ensure_topics(
                ServiceConfig(
                    bootstrap_servers=options.bootstrap_servers,
                    queue_topic=options.topic,
                    marker_topic=options.marker_topic,
                    control_topic=options.control_topic,
                    security=conn.security,
                )
            )
        from kmq.control import read_control

        layout = read_control(conn, options.control_topic).layout(options.topic)
        names = set(schema.fieldNames())
        return KmqWriter(
            options, layout, has_queue="queue" in names, has_headers="headers" in names
        )


class KafkaSplit(InputPartition):
    """One Spark partition: an offset range of one Kafka partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


class KmqReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def plan(self) -> list[OffsetRange]:
        """The offset ranges this read covers (asks Kafka for the high watermarks)."""
        o = self.options
        bounds = partition_bounds(o.bootstrap_servers, o.topic, dict(o.kafka))
        ranges = ranges_to_read(o.topic, bounds, o.start_offsets, o.end_offsets)
        return split_ranges(ranges, o.max_records_per_split)

    def partitions(self) -> Sequence[InputPartition]:
        return [KafkaSplit(rng) for rng in self.plan()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, KafkaSplit):  # an empty plan reads one None partition
            return
        yield from read_split(self.options, self.schema, partition.range)


def read_split(options: ReadOptions, schema: StructType, rng: OffsetRange) -> Iterator[Any]:
    """The records of ``rng`` as Arrow record batches of ``schema``'s columns (batch and
    streaming reads share this)."""
    o = options
    arrow_schema = to_arrow_schema(schema)
    columns = (
        QueueColumns(arrow_schema, o.queue)
        if o.kind == "queue"
        else MarkerColumns(arrow_schema, o.queue)
    )
    with_headers = o.kind == "queue" and bool(set(schema.fieldNames()) & _HEADER_COLUMNS)
    runs = read_range(
        o.bootstrap_servers, rng, dict(o.kafka), o.idle_timeout_ms, with_headers=with_headers
    )
    for run in runs:
        columns.extend_run(run)
        if columns.rows >= o.batch_rows:
            yield columns.flush()
    if columns.rows:
        yield columns.flush()


def check_write_schema(schema: StructType, *, has_queue_option: bool) -> None:
    """``payload`` (binary or string), optional ``headers`` and ``queue``; nothing else."""
    text_or_bytes = (BinaryType(), StringType())
    fields = {f.name: f.dataType for f in schema.fields}
    extra = set(fields) - {"payload", "headers", "queue"}
    if extra:
        raise ConfigError(
            f"format('kmq') writes columns payload, headers and queue; drop {sorted(extra)}"
        )
    if fields.get("payload") not in text_or_bytes:
        raise ConfigError("format('kmq') needs a payload column of type binary or string")
    headers = fields.get("headers")
    as_map = (
        isinstance(headers, MapType)
        and headers.keyType == StringType()
        and headers.valueType in text_or_bytes
    )
    as_list = (
        isinstance(headers, ArrayType)
        and isinstance(headers.elementType, StructType)
        and [f.name for f in headers.elementType.fields] == ["key", "value"]
    )
    if headers is not None and not (as_map or as_list):
        raise ConfigError(
            "format('kmq'): headers must be map<string,binary|string> "
            "or array<struct<key:string,value:binary>>"
        )
    if "queue" in fields and fields["queue"] != StringType():
        raise ConfigError("format('kmq'): the queue column must be a string")
    if "queue" not in fields and not has_queue_option:
        raise ConfigError("format('kmq') needs option queue or a queue column")


def _bytes(value: Any) -> Any:
    return value.encode() if isinstance(value, str) else value


def _user_headers(value: Any) -> tuple[tuple[str, bytes], ...]:
    if value is None:
        return ()
    if isinstance(value, dict):
        return check_headers({k: _bytes(v) for k, v in value.items()})
    out: list[tuple[str, bytes]] = []
    for item in value:  # array<struct<key, value>>: order and repeats kept
        out.extend(check_headers({item["key"]: _bytes(item["value"])}))
    return tuple(out)


@dataclass
class KmqWriteCommit(WriterCommitMessage):
    rows: int


class KmqWriter(DataSourceWriter):
    """Enqueues rows like ``Producer.send()``: a fresh message id, attempt 1, the user
    headers, the queue id as key, round-robin over the queue's partitions (the topic's
    layout, read once by the driver). At-least-once: a retried Spark task enqueues its rows
    again."""

    def __init__(
        self,
        options: WriteOptions,
        layout: TopicLayout | None,
        *,
        has_queue: bool,
        has_headers: bool,
    ) -> None:
        self.options = options
        self.layout = layout
        self.has_queue = has_queue
        self.has_headers = has_headers

    def write(self, iterator: Iterator[Row]) -> KmqWriteCommit:
        o = self.options
        producer = open_producer(o.bootstrap_servers, dict(o.kafka), o.max_message_bytes)
        errors: list[BaseException] = []
        rows = 0
        try:
            partitions = len(producer.partitions_for(o.topic) or ())
            if not partitions:
                raise BrokerError(f"topic {o.topic!r} does not exist")
            rr = itertools.count(random.randrange(1 << 16))
            placement: dict[str, tuple[int, ...]] = {}
            for row in iterator:
                row_queue = row["queue"] if self.has_queue else None
                queue = check_queue_id(row_queue if row_queue is not None else o.queue)
                payload = check_payload(_bytes(row["payload"]))
                user = _user_headers(row["headers"] if self.has_headers else None)
                message_id = new_message_id()
                self._check_size(queue, payload, user)
                own = placement.get(queue)
                if own is None:
                    own = placement[queue] = write_partitions(self.layout, queue, partitions)
                future = producer.send(
                    o.topic,
                    key=queue.encode(),
                    value=payload,
                    headers=queue_headers(message_id, 1, user),
                    partition=own[next(rr) % len(own)],
                )
                future.add_errback(errors.append)
                rows += 1
                if errors:
                    break
            producer.flush()
        finally:
            producer.close()
        if errors:
            raise BrokerError(f"enqueueing to {o.topic!r} failed: {errors[0]!r}")
        return KmqWriteCommit(rows)

    def _check_size(
        self, queue: str, payload: bytes, headers: tuple[tuple[str, bytes], ...]
    ) -> None:
        limit = self.options.max_message_bytes
        rough = len(payload) + sum(len(k) * 4 + len(v) for k, v in headers)
        if rough + _SLACK_BYTES <= limit:
            return
        size = record_size(queue.encode(), payload, headers)
        if size > limit:
            raise MessageTooLargeError(
                f"a payload of {len(payload)} bytes makes a record of up to {size} bytes, "
                f"over the {limit}-byte limit (max_message_bytes)"
            )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, KmqWriteCommit))
        log.info("enqueued %d rows to %s", rows, self.options.topic)
