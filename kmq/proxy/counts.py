"""Approximate queue depth, for SQS's ApproximateNumberOfMessages and the native stats.

kmq keeps no per-queue counter, so this is the lag of the queue's consumer groups: on each
partition the queue reads (queue topic and retry topic), the high watermark minus the
group's committed offset. It counts the messages no consumer has taken yet. It does not
count messages in flight (buffered in a consumer or held by a client) or waiting out a
nack delay, and on partitions the queue shares with other queues it counts their records
too: an upper bound of what is waiting, exact for a queue with partitions of its own.

This is the proxy's one use of Kafka clients outside kmq's public API (kmq has no lag call).
"""

from __future__ import annotations

from kafka import TopicPartition
from kafka.errors import KafkaError

from kmq import kafka_clients
from kmq.errors import BrokerError
from kmq.service import Service
from kmq.topics import high_watermarks


def waiting_messages(service: Service, queue: str, timeout_s: float = 10.0) -> int:
    cfg = service.config
    group = f"kmq.{cfg.queue_topic}.{queue}"  # kmq.ConsumerConfig's default group ids
    lanes = ((cfg.queue_topic, group), (cfg.retry_topic, f"{group}.retry"))
    wanted = {
        topic: [TopicPartition(topic, p) for p in sorted(service.read_partitions(queue, topic))]
        for topic, _ in lanes
    }
    highs = high_watermarks(cfg.connection, [tp for tps in wanted.values() for tp in tps],
                            timeout_s)  # fmt: skip
    admin = kafka_clients.admin(cfg.connection, "proxy-counts")
    try:
        found = admin.list_group_offsets({group_id: wanted[topic] for topic, group_id in lanes})
        total = 0
        for topic, group_id in lanes:
            committed = found.get(group_id, {})
            for tp in wanted[topic]:
                meta = committed.get(tp)
                start = meta.offset if meta is not None and meta.offset >= 0 else 0
                total += max(0, highs[tp] - start)
        return total
    except KafkaError as exc:
        raise BrokerError(f"reading the offsets of queue {queue!r} failed: {exc}") from exc
    finally:
        admin.close()
