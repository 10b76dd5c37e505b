"""Dead letters: listing a queue's dead-letter queue and replaying it into the queue."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kafka import TopicPartition
from kafka.errors import KafkaError

from kmq import kafka_clients
from kmq.errors import BrokerError
from kmq.records import (
    DLQ_ATTEMPTS_HEADER,
    DLQ_HEADERS,
    DLQ_ORIGIN_HEADER,
    DLQ_REASON_HEADER,
    parse_queue_headers,
)
from kmq.service import Queue


@dataclass(frozen=True)
class DeadLetter:
    message_id: str
    origin_queue: str
    attempts: int
    reason: str
    partition: int
    offset: int
    timestamp_ms: int
    payload: bytes


def list_dead_letters(queue: Queue, limit: int = 100, timeout_s: float = 30.0) -> list[DeadLetter]:
    """Dead letters of ``queue`` that no consumer of its dead-letter queue has taken yet."""
    svc = queue.service
    cfg = svc.config
    svc.ensure_topics()
    dlq = svc.queue(queue.dead_letter_queue)
    group = f"kmq.{cfg.queue_topic}.{dlq.id}"
    key = dlq.id.encode()
    reader = kafka_clients.consumer(
        cfg.connection, "dlq-reader", group_id=group, enable_auto_commit=False
    )
    try:
        partitions = sorted(reader.partitions_for_topic(cfg.queue_topic) or ())
        tps = [TopicPartition(cfg.queue_topic, p) for p in partitions]
        reader.assign(tps)
        for tp in tps:
            committed = reader.committed(tp)
            if committed is None:
                reader.seek_to_beginning(tp)
            else:
                reader.seek(tp, committed)
        found: list[DeadLetter] = []
        done: set[TopicPartition] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < len(tps) and len(found) < limit:
            if time.monotonic() > deadline:
                raise BrokerError(f"could not read {cfg.queue_topic} to its end in {timeout_s} s")
            for batch in reader.poll(timeout_ms=200).values():
                for record in batch:
                    if record.key == key and len(found) < limit:
                        found.append(_dead_letter(record))
            for tp in tps:
                highwater = reader.highwater(tp)  # end_offsets() is wrong on some brokers
                if highwater is not None and reader.position(tp) >= highwater:
                    done.add(tp)
        return found
    except KafkaError as exc:
        raise BrokerError(f"listing dead letters failed: {exc}") from exc
    finally:
        reader.close()


def replay_dead_letters(queue: Queue, limit: int | None = None, idle_s: float = 3.0) -> int:
    """Move dead letters back to ``queue`` with their attempt count reset; return how many.

    Each keeps its id, payload and original headers. It stops after ``limit`` messages, or
    once the dead-letter queue has been idle for ``idle_s`` after the first message.
    """
    svc = queue.service
    dlq = svc.queue(queue.dead_letter_queue)
    producer = queue.producer()
    moved = 0
    with dlq.consumer(max_in_flight=100 if limit is None else max(1, min(limit, 100))) as consumer:
        wait_s = 10.0 + svc.config.session_timeout_ms / 1000  # the first join takes a while
        while limit is None or moved < limit:
            message = consumer.receive(timeout_s=wait_s)
            if message is None:
                break
            wait_s = idle_s
            headers = tuple((k, v) for k, v in message.headers.items() if k not in DLQ_HEADERS)
            producer._write(message.id, message.payload, headers, wait=True)
            message.ack()
            moved += 1
    return moved


def _dead_letter(record: object) -> DeadLetter:
    message_id, _, headers = parse_queue_headers(record.headers)  # type: ignore[attr-defined]
    extra = dict(headers)
    return DeadLetter(
        message_id=message_id or "",
        origin_queue=extra.get(DLQ_ORIGIN_HEADER, b"").decode("utf-8", "replace"),
        attempts=int(extra.get(DLQ_ATTEMPTS_HEADER, b"0") or 0),
        reason=extra.get(DLQ_REASON_HEADER, b"").decode("utf-8", "replace"),
        partition=record.partition,  # type: ignore[attr-defined]
        offset=record.offset,  # type: ignore[attr-defined]
        timestamp_ms=record.timestamp,  # type: ignore[attr-defined]
        payload=record.value or b"",  # type: ignore[attr-defined]
    )
