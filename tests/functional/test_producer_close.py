"""Giving a producer up while its records are unanswered (kmq.kafka_clients.close_producer),
against a real broker that goes away: kafka-python's own close() raises and leaves the
producer's I/O thread running; close_producer stops it and fails the records."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaTimeoutError

from kmq import kafka_clients
from kmq.dev.embedded import EmbeddedBroker


def stranded(tmp_path: Path) -> tuple[KafkaProducer, object]:
    """A producer that has sent one record, then one more after its broker is gone."""
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    try:
        topic = f"close-{uuid.uuid4().hex[:8]}"
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])
        finally:
            admin.close()
        producer = kafka_clients.producer(
            kafka_clients.connection(broker.bootstrap_servers),
            "close-test",
            acks="all",
            enable_idempotence=True,
            linger_ms=0,
        )
        producer.send(topic, b"answered").get(timeout=20)  # connected, metadata known
    finally:
        if broker.process is not None:  # gone at once, as in a crash
            broker.process.kill()
            broker.process.wait(5)
        broker.stop()
    return producer, producer.send(topic, b"unanswered")


def test_kafka_python_close_raises_and_leaves_the_thread_running(tmp_path: Path) -> None:
    """Why close_producer exists; if a kafka-python upgrade fixes this, drop the workaround."""
    producer, future = stranded(tmp_path)
    sender = producer._sender
    try:
        with pytest.raises(KafkaTimeoutError):
            producer.close(timeout=0.5)
        assert sender.is_alive() and not future.is_done  # type: ignore[attr-defined]
    finally:
        sender.force_close()
        sender.join(5)
    assert not sender.is_alive()


def test_close_producer_stops_the_thread_and_fails_what_is_left(tmp_path: Path) -> None:
    producer, future = stranded(tmp_path)
    sender = producer._sender
    kafka_clients.close_producer(producer, 0.5)
    assert not sender.is_alive(), "the producer's I/O thread stopped"
    assert future.is_done and future.failed()  # type: ignore[attr-defined]
    assert producer._closed
    kafka_clients.close_producer(producer, 0.5)  # closing again is harmless
