"""spark.readStream.format("kmq") against a real broker: checkpointed offsets that survive a
restart exactly, admission control, and bad records that become rows, not failures."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import kmq
from kmq.markers import Marker, MarkerType, encode
from kmq.records import queue_headers
from kmq.topics import ensure_topics
from tests.functional.helpers import wait_until

PER_TRIGGER = 10


def _topics(bootstrap: str) -> kmq.ServiceConfig:
    tag = uuid.uuid4().hex[:8]
    config = kmq.ServiceConfig(
        bootstrap_servers=bootstrap,
        queue_topic=f"st{tag}.queue",
        marker_topic=f"st{tag}.markers",
        queue_partitions=3,
        marker_partitions=2,
    )
    ensure_topics(config)
    return config


def _send(producer: KafkaProducer, topic: str, ids: range) -> None:
    for i in ids:
        producer.send(topic, key=b"q", value=b"%d" % i, headers=queue_headers(f"m{i}", 1, ()),
                      partition=i % 3)  # fmt: skip
    producer.flush()


def _stream(
    spark: SparkSession, config: kmq.ServiceConfig, kind: str = "queue", **extra: str
) -> DataFrame:
    reader = (
        spark.readStream.format("kmq")
        .option("kind", kind)
        .option("bootstrap_servers", config.bootstrap_servers)
        .option("topic", config.queue_topic if kind == "queue" else config.marker_topic)
        .option("max_records_per_trigger", str(PER_TRIGGER))
    )
    for key, value in extra.items():
        reader = reader.option(key, value)
    return reader.load()


def _start(spark: SparkSession, config: kmq.ServiceConfig, out: Path) -> StreamingQuery:
    return (
        _stream(spark, config)
        .select("partition", "offset", "message_id")
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def _batch_sizes(query: StreamingQuery) -> list[int]:
    return [int(p["numInputRows"]) for p in query.recentProgress]


def test_a_restarted_query_continues_exactly_where_it_stopped(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    config = _topics(bootstrap)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    _send(producer, config.queue_topic, range(30))
    first = _start(spark, config, tmp_path)
    # Stop it a few capped batches in. Whether it gets to stop mid-way (records left, or a
    # planned batch not yet committed) depends on the machine's speed; either way 15 more
    # records arrive after the stop, so the restarted query always has to continue.
    wait_until(lambda: sum(_batch_sizes(first)) >= 2 * PER_TRIGGER, 60, "two batches")
    first.stop()
    sizes = _batch_sizes(first)
    assert 0 < sum(sizes) <= 30, sizes
    _send(producer, config.queue_topic, range(30, 45))
    producer.close()
    second = _start(spark, config, tmp_path)
    try:
        second.processAllAvailable()
        more = _batch_sizes(second)
    finally:
        second.stop()
    assert max(sizes + more) <= PER_TRIGGER, (sizes, more)  # capped after the restart too
    assert len([n for n in more if n]) >= (45 - sum(sizes)) // PER_TRIGGER
    assert sum(sizes) + sum(more) == 45, ("each record read once across the restart", sizes, more)
    streamed = spark.read.parquet(str(tmp_path / "data")).collect()
    batch = (
        spark.read.format("kmq")
        .option("bootstrap_servers", bootstrap)
        .option("topic", config.queue_topic)
        .load()
        .select("partition", "offset", "message_id")
        .collect()
    )
    key = sorted  # rows compare as tuples
    assert len(streamed) == 45, "a duplicate or a gap"
    assert key(map(tuple, streamed)) == key(map(tuple, batch))
    assert {r["message_id"] for r in streamed} == {f"m{i}" for i in range(45)}


def test_starting_offsets_latest_reads_only_what_comes_after(
    spark: SparkSession, bootstrap: str
) -> None:
    config = _topics(bootstrap)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    _send(producer, config.queue_topic, range(5))
    name = f"latest_{uuid.uuid4().hex[:8]}"
    query = (
        _stream(spark, config, starting_offsets="latest")
        .select("message_id")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        _send(producer, config.queue_topic, range(5, 8))
        wait_until(
            lambda: spark.table(name).count() >= 3, 60, "the three records sent after the start"
        )
        query.processAllAvailable()
        assert sorted(r[0] for r in spark.table(name).collect()) == ["m5", "m6", "m7"]
    finally:
        query.stop()
        producer.close()


def test_markers_stream_turns_bad_records_into_rows(spark: SparkSession, bootstrap: str) -> None:
    config = _topics(bootstrap)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    good = encode(Marker(MarkerType.START, 0, 3, 1, 30_000))
    for value in (good, b"\xff garbage", b"\x09\x00\x00\x00\x01future version", good):
        producer.send(config.marker_topic, value=value, partition=0)
    producer.flush()
    producer.close()
    name = f"markers_{uuid.uuid4().hex[:8]}"
    query = (
        _stream(spark, config, "markers")
        .select("marker_offset", "type", "error")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        assert query.exception() is None
        rows: list[Any] = sorted(spark.table(name).collect())
    finally:
        query.stop()
    assert [(r["marker_offset"], r["type"]) for r in rows] == [
        (0, "START"), (1, None), (2, None), (3, "START")
    ]  # fmt: skip
    assert rows[1]["error"] and rows[2]["error"] and rows[0]["error"] is None
