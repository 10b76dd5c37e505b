"""The SDK's opt-in metrics (kmq.metrics) for a known workload on a real broker."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

import kmq
from tests.functional.helpers import wait_until


def test_sdk_metrics_count_a_known_workload(make_service: Callable[..., kmq.Service]) -> None:
    registry = CollectorRegistry()
    svc = make_service(metrics=registry)

    def value(name: str, queue: str = "counted") -> float:
        return registry.get_sample_value(name, {"queue": queue}) or 0.0

    q = svc.queue("counted")
    producer = q.producer()
    for i in range(3):
        producer.send(f"m{i}".encode())
    ids = producer.send_many([(b"m3", None), (b"m4", None)])
    assert all(isinstance(i, str) for i in ids), ids
    assert value("kmq_messages_sent_total") == 5
    with q.consumer(max_in_flight=10) as consumer:
        held: list[kmq.Message] = []

        def all_five() -> bool:
            held.extend(consumer.receive_many(5 - len(held), timeout_s=0.2))
            return len(held) == 5

        wait_until(all_five, 20, "5 messages")
        taken = time.monotonic()
        assert value("kmq_messages_received_total") == 5
        assert value("kmq_messages_in_flight") == 5
        # Held past a third of the 1 s lease: the consumer keeps them alive.
        wait_until(lambda: value("kmq_keepalives_total") >= 5, 10, "keep-alives")
        held_s = time.monotonic() - taken  # each was held at least this long
        held[0].ack()
        consumer.ack_many(held[1:3])
        held[3].nack(delay_s=30)
        held[4].reject(reason="poison")
        assert value("kmq_messages_acked_total") == 3
        assert value("kmq_messages_nacked_total") == 1
        assert value("kmq_messages_rejected_total") == 1
        assert value("kmq_message_processing_seconds_count") == 5
        assert value("kmq_message_processing_seconds_sum") >= 5 * held_s
        assert value("kmq_messages_in_flight") == 0
    assert value("kmq_messages_sent_total", "other") == 0
