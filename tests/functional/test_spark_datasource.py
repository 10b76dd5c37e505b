"""format("kmq") against a real broker from a real local Spark session: both kinds of read,
offset planning, and bulk writes that kmq consumers receive like send()'s messages."""

from __future__ import annotations

import os
import re
import uuid

import pytest
from kafka import KafkaProducer
from pyspark.sql import DataFrameReader, SparkSession

import kmq
from kmq.markers import Marker, MarkerType, encode, encode_batch
from kmq.markers_v1 import encode_v1
from kmq.records import queue_headers
from kmq.spark.kafka_io import partition_bounds
from kmq.topics import ensure_topics


def _topics(bootstrap: str, partitions: int = 3) -> kmq.ServiceConfig:
    tag = uuid.uuid4().hex[:8]
    config = kmq.ServiceConfig(
        bootstrap_servers=bootstrap,
        queue_topic=f"ds{tag}.queue",
        marker_topic=f"ds{tag}.markers",
        queue_partitions=partitions,
        marker_partitions=partitions,
        session_timeout_ms=2000 if "KMQ_TEST_BOOTSTRAP_SERVERS" not in os.environ else 6000,
    )
    ensure_topics(config)
    return config


def _reader(spark: SparkSession, config: kmq.ServiceConfig, kind: str = "queue") -> DataFrameReader:
    topic = config.queue_topic if kind == "queue" else config.marker_topic
    return (
        spark.read.format("kmq")
        .option("kind", kind)
        .option("bootstrap_servers", config.bootstrap_servers)
        .option("topic", topic)
    )


def test_read_queue_records_sent_by_the_sdk(spark: SparkSession, bootstrap: str) -> None:
    config = _topics(bootstrap)
    with kmq.Service(config) as svc:
        producer = svc.queue("orders").producer()
        ids = [producer.send(b"order-%d" % i, {"n": b"%d" % i}) for i in range(20)]
        other = svc.queue("emails").producer().send(b"mail")
    df = _reader(spark, config).option("max_records_per_split", "3").load()
    assert df.schema.simpleString() == (
        "struct<partition:int,offset:bigint,timestamp:timestamp,queue:string,message_id:string,"
        "attempt:int,dead_letter_origin:string,headers:array<struct<key:string,value:binary>>,"
        "payload:binary>"
    )
    bounds = partition_bounds(bootstrap, config.queue_topic)
    assert df.rdd.getNumPartitions() == sum(-(-hi // 3) for _, hi in bounds.values() if hi)
    rows = {r["message_id"]: r for r in df.collect()}
    assert set(rows) == {*ids, other}
    for i, message_id in enumerate(ids):
        row = rows[message_id]
        assert (row["queue"], row["attempt"], bytes(row["payload"])) == (
            "orders",
            1,
            b"order-%d" % i,
        )
        assert [(h["key"], bytes(h["value"])) for h in row["headers"]] == [("n", b"%d" % i)]
    assert len({(r["partition"], r["offset"]) for r in rows.values()}) == 21
    assert rows[other]["queue"] == "emails"
    only = _reader(spark, config).option("queue", "emails").load()
    assert [r["message_id"] for r in only.collect()] == [other]


def test_read_stops_at_the_planned_offsets(spark: SparkSession, bootstrap: str) -> None:
    config = _topics(bootstrap, partitions=1)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(10):
        producer.send(config.queue_topic, key=b"q", value=b"%d" % i,
                      headers=queue_headers(f"m{i}", 1, ()), partition=0)  # fmt: skip
    producer.flush()
    df = (
        _reader(spark, config)
        .option("start_offsets", '{"0": 2}')
        .option("end_offsets", '{"0": 5}')
        .load()
    )
    assert [r["message_id"] for r in df.orderBy("offset").collect()] == ["m2", "m3", "m4"]
    subset = _reader(spark, config).schema("offset bigint, payload binary").load()
    assert [bytes(r["payload"]) for r in subset.orderBy("offset").collect()] == [
        b"%d" % i for i in range(10)
    ]
    producer.close()


def test_read_every_marker_field_of_an_old_marker(spark: SparkSession, bootstrap: str) -> None:
    """Version 1 markers (kmq 0.1) stay readable, every field of them."""
    config = _topics(bootstrap)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    start = encode_v1(type=MarkerType.START, queue="orders", partition=2, offset=17,
                      message_id="m1", attempt=1, redeliver_after_ms=30_000, key=b"orders",
                      value=b"body", headers=[("h", b"v")], max_attempts=5,
                      dead_letter_queue="orders.dlq")  # fmt: skip
    nack = encode_v1(type=MarkerType.NACK, queue="orders", partition=2, offset=17,
                     message_id="m1", attempt=1, redeliver_after_ms=500,
                     reason="later")  # fmt: skip
    for value in (start, nack):
        producer.send(config.marker_topic, key=b"m1", value=value, timestamp_ms=1234)
    producer.send(config.marker_topic, key=b"x", value=b"garbage")
    producer.flush()
    producer.close()
    df = _reader(spark, config, "markers").load()
    rows = df.orderBy("marker_partition", "marker_offset").collect()
    good = [r.asDict() for r in rows if r["error"] is None]
    assert [(r["type"], r["reason"], r["redeliver_after_ms"]) for r in good] == [
        ("START", "", 30_000),
        ("NACK", "later", 500),
    ]
    s = good[0]
    assert (s["queue"], s["partition"], s["offset"], s["message_id"], s["attempt"]) == (
        "orders", 2, 17, "m1", 1
    )  # fmt: skip
    assert (bytes(s["key"]), bytes(s["value"]), s["max_attempts"], s["dead_letter_queue"]) == (
        b"orders", b"body", 5, "orders.dlq"
    )  # fmt: skip
    assert [(h["key"], bytes(h["value"])) for h in s["headers"]] == [("h", b"v")]
    assert (s["version"], s["type_id"], int(s["timestamp"].timestamp() * 1000)) == (1, 1, 1234)
    assert s["lane"] == 0
    assert good[0]["marker_partition"] == good[1]["marker_partition"]  # keyed by message id
    assert good[1]["marker_offset"] == good[0]["marker_offset"] + 1
    [bad] = [r for r in rows if r["error"] is not None]
    assert bad["error"].startswith("not a protobuf marker") and bad["type"] is None


def test_read_every_marker_field(spark: SparkSession, bootstrap: str) -> None:
    """Version 2 markers: several in one record, each a row at the record's position."""
    config = _topics(bootstrap)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    start = Marker(MarkerType.START, 2, 17, 1, 30_000, 5, dead_letter_queue="orders.dlq")
    nack = Marker(MarkerType.NACK, 2, 17, 1, 500, reason="later")
    end = Marker(MarkerType.END, 1, 4, 3, lane=1)
    producer.send(config.marker_topic, value=encode_batch([start, nack]), timestamp_ms=1234)
    producer.send(config.marker_topic, value=encode(end), timestamp_ms=1235)
    producer.send(config.marker_topic, value=b"\x02\x00\x00\x00\x09short")
    producer.flush()
    producer.close()
    rows = [r.asDict() for r in _reader(spark, config, "markers").load().collect()]
    good = sorted((r for r in rows if r["error"] is None), key=lambda r: r["type_id"])
    assert [
        (r["type"], r["lane"], r["partition"], r["offset"], r["attempt"], r["version"])
        for r in good
    ] == [("START", 0, 2, 17, 1, 2), ("END", 1, 1, 4, 3, 2), ("NACK", 0, 2, 17, 1, 2)]
    s, _, n = good
    assert (s["redeliver_after_ms"], s["max_attempts"], s["dead_letter_queue"]) == (
        30_000, 5, "orders.dlq"
    )  # fmt: skip
    assert (n["reason"], n["redeliver_after_ms"]) == ("later", 500)
    assert (s["marker_partition"], s["marker_offset"]) == (n["marker_partition"],
                                                           n["marker_offset"])  # fmt: skip
    assert (s["queue"], s["message_id"], s["key"], s["value"], s["headers"]) == (None,) * 5
    [bad] = [r for r in rows if r["error"] is not None]
    assert "cannot hold 9 markers" in bad["error"] and bad["type"] is None


def test_write_enqueues_like_send(spark: SparkSession, bootstrap: str) -> None:
    config = _topics(bootstrap)
    rows = [(f"job-{i}".encode(), {"k": f"v{i}".encode()}) for i in range(30)]
    df = spark.createDataFrame(rows, "payload binary, headers map<string,binary>").repartition(3)
    (
        df.write.format("kmq")
        .option("bootstrap_servers", bootstrap)
        .option("topic", config.queue_topic)
        .option("marker_topic", config.marker_topic)
        .option("queue", "jobs")
        .mode("append")
        .save()
    )
    back = {r["message_id"]: r for r in _reader(spark, config).load().collect()}
    assert len(back) == 30 and all(re.fullmatch(r"[0-9a-f]{32}", m) for m in back)
    assert {r["queue"] for r in back.values()} == {"jobs"}
    assert {r["attempt"] for r in back.values()} == {1}
    with kmq.Service(config) as svc:  # spread over the queue's partitions, like send()
        assert {r["partition"] for r in back.values()} == set(svc.write_partitions("jobs"))
    with kmq.Service(config) as svc, svc.queue("jobs").consumer() as consumer:
        got: dict[str, kmq.Message] = {}
        while len(got) < 30:
            message = consumer.receive(timeout_s=30)
            assert message is not None, f"only {len(got)} of 30 messages arrived"
            got[message.id] = message
            message.ack()
    assert set(got) == set(back)
    by_payload = {m.payload: dict(m.headers) for m in got.values()}
    assert by_payload == {p: h for p, h in rows}


def test_write_rejects_what_send_rejects(spark: SparkSession, bootstrap: str) -> None:
    config = _topics(bootstrap)
    writer = (
        spark.createDataFrame([("x", "q")], "payload string, other string")
        .write.format("kmq")
        .option("bootstrap_servers", bootstrap)
        .option("topic", config.queue_topic)
        .option("queue", "jobs")
        .mode("append")
    )
    with pytest.raises(Exception, match="drop \\['other'\\]"):
        writer.save()
    reserved = spark.createDataFrame([("x", {"kmq.id": "forged"})], "payload string, "
                                     "headers map<string,string>")  # fmt: skip
    with pytest.raises(Exception, match="reserved"):
        reserved.write.format("kmq").option("bootstrap_servers", bootstrap).option(
            "topic", config.queue_topic
        ).option("queue", "jobs").mode("append").save()
    assert sum(hi for _, hi in partition_bounds(bootstrap, config.queue_topic).values()) == 0
