"""The DataFrame schemas of the two kinds of kmq topic."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kmq.errors import ConfigError

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
"""Record headers in order, duplicates kept, like Spark's own Kafka connector."""

QUEUE_SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType()),
        StructField("queue", StringType()),
        StructField("message_id", StringType()),
        StructField("attempt", IntegerType()),
        StructField("dead_letter_origin", StringType()),
        StructField("headers", HEADERS),
        StructField("payload", BinaryType()),
    ]
)
"""Queue-topic records. ``queue`` is the record key; ``message_id`` and ``attempt`` come from
the ``kmq.id`` and ``kmq.attempt`` headers (a record without ``kmq.id`` gets the id kmq
consumers give it, ``ext-<partition>-<offset>``); ``dead_letter_origin`` is the queue a dead
letter came from (its ``kmq.dlq.origin`` header), null for other records; ``headers`` are all
headers but ``kmq.id`` and ``kmq.attempt``."""

MARKERS_SCHEMA = StructType(
    [
        StructField("marker_partition", IntegerType(), False),
        StructField("marker_offset", LongType(), False),
        StructField("timestamp", TimestampType()),
        StructField("type", StringType()),
        StructField("type_id", IntegerType()),
        StructField("version", IntegerType()),
        StructField("lane", IntegerType()),
        StructField("queue", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("message_id", StringType()),
        StructField("attempt", IntegerType()),
        StructField("redeliver_after_ms", LongType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("headers", HEADERS),
        StructField("reason", StringType()),
        StructField("max_attempts", IntegerType()),
        StructField("dead_letter_queue", StringType()),
        StructField("error", StringType()),
    ]
)
"""Markers-topic records. ``marker_partition``/``marker_offset``/``timestamp`` locate the
marker record itself; ``lane``/``partition``/``offset`` name the record it is about (lane 0:
the queue topic). Version 2 markers (kmq 0.2) carry no ``queue``, ``message_id``, ``key``,
``value`` or ``headers`` (null): join them with the queue records.
``type`` is the marker type's name (``UNKNOWN_<n>`` for a type this build does not know);
``error`` is set, and the marker fields may be null, when the record is not a valid marker."""

SCHEMAS: dict[str, StructType] = {"queue": QUEUE_SCHEMA, "markers": MARKERS_SCHEMA}


def check_requested(kind: str, requested: StructType) -> None:
    """A user-given schema must pick columns of the kind's schema, with their types."""
    full: dict[str, DataType] = {f.name: f.dataType for f in SCHEMAS[kind].fields}
    for f in requested.fields:
        if f.name not in full:
            raise ConfigError(
                f"format('kmq') kind {kind}: no column {f.name!r}; columns are {list(full)}"
            )
        if f.dataType != full[f.name]:
            raise ConfigError(
                f"format('kmq') kind {kind}: column {f.name} is "
                f"{full[f.name].simpleString()}, not {f.dataType.simpleString()}"
            )
