"""Bytes written to the broker per message: every record on the run's topics, read back,
sized as the record format stores it (key, value, headers and the per-record varints;
the 61-byte header of each record batch and offset commits are not counted)."""

from __future__ import annotations

import time

from bench.common import JSON


def record_bytes(record: object) -> int:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    headers = [(k, v) for k, v in getattr(record, "headers", None) or ()]
    return int(
        DefaultRecordBatchBuilder.size_in_bytes(
            1, 1, getattr(record, "key", None), getattr(record, "value", None), headers
        )
    )


def topic_bytes(bootstrap_servers: str, topics: list[str], timeout_s: float = 60.0) -> JSON:
    """Records and bytes per topic, read from the beginning to the high watermarks."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap_servers, enable_auto_commit=False, fetch_max_wait_ms=50
    )
    out: JSON = {}
    try:
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            records = size = 0
            done: set[object] = set()
            deadline = time.monotonic() + timeout_s
            while len(done) < len(tps):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read {topic} to its end")
                for batch in consumer.poll(timeout_ms=200, max_records=50_000).values():
                    records += len(batch)
                    size += sum(record_bytes(r) for r in batch)
                for tp in tps:
                    hw = consumer.highwater(tp)
                    if hw is not None and consumer.position(tp) >= hw:
                        done.add(tp)
            out[topic] = {"records": records, "bytes": size}
    finally:
        consumer.close()
    return out
