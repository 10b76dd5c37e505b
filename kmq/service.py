"""The entry point: a Service holds the connection settings and hands out queues."""

from __future__ import annotations

import datetime
import threading
import time
from functools import partial
from typing import Any

from kafka import KafkaProducer

from kmq import kafka_clients
from kmq.config import ConsumerConfig, ServiceConfig
from kmq.consumer import Consumer
from kmq.control import ControlWatcher, set_layout, set_pause
from kmq.errors import BrokerError, ConfigError, InvalidArgumentError, KmqError
from kmq.layout import TopicLayout, grown, read_partitions, write_partitions
from kmq.policy import RetryPolicy
from kmq.producer import Producer
from kmq.topics import ensure_topics
from kmq.validation import check_queue_id


class Queue:
    """A logical queue multiplexed onto the service's queue topic. Get it from
    :meth:`Service.queue`; creating one is free."""

    def __init__(self, service: Service, queue_id: str, policy: RetryPolicy) -> None:
        self.service = service
        self.id = queue_id
        self.policy = policy

    @property
    def dead_letter_queue(self) -> str:
        """Where this queue's dead letters go (``<id>.dlq`` unless the policy says otherwise)."""
        return self.policy.dead_letter_queue_for(self.id)

    def producer(self) -> Producer:
        """A producer for this queue."""
        return Producer(self)

    def pause(self, until: datetime.datetime) -> None:
        """Pause the queue until ``until`` (timezone-aware): consumers hand out nothing new
        and the tracker holds its redeliveries. Stored in the control topic, so every
        process sees it."""
        if not isinstance(until, datetime.datetime) or until.tzinfo is None:
            raise InvalidArgumentError("until must be a timezone-aware datetime")
        self._set_pause(max(1, int(until.timestamp() * 1000)))

    def resume(self) -> None:
        """End a pause now."""
        self._set_pause(0)

    def paused_until(self) -> datetime.datetime | None:
        """When the current pause ends, or ``None`` if the queue is not paused."""
        until_ms = self.service.control_watcher().paused_until_ms(self.id)
        return datetime.datetime.fromtimestamp(until_ms / 1000, datetime.UTC) if until_ms else None

    def spread(self) -> int:
        """How many queue-topic partitions this queue's records go to."""
        return len(self.service.write_partitions(self.id))

    def set_spread(self, partitions: int) -> None:
        """Spread this queue over ``partitions`` partitions of the queue topic (a hot queue
        needs several for several consumer processes). A spread only grows: the partitions
        it would give up may still hold the queue's records. Consumers pick it up within
        about a second, with one rebalance of the queue's group."""
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise InvalidArgumentError(f"partitions must be an integer >= 1, got {partitions!r}")
        svc = self.service
        svc.ensure_topics()
        cfg = svc.config
        watcher = svc.control_watcher()
        timeout_s = cfg.request_timeout_ms / 1000
        for topic in (cfg.queue_topic, cfg.retry_topic):
            layout = watcher.layout(topic, timeout_s)
            if layout is None:
                if topic == cfg.retry_topic:
                    continue  # none there: every queue reads all of it
                raise KmqError(
                    f"queue topic {topic} has no layout yet (it predates kmq 0.2): "
                    "give it one with `kmq topics layout` first"
                )
            try:
                updated = grown(layout, self.id, min(partitions, layout.partitions))
            except ValueError as exc:
                raise InvalidArgumentError(str(exc)) from None
            set_layout(cfg.connection, cfg.control_topic, topic, updated)
            watcher.wait_for(partial(_shows, watcher, topic, updated), timeout_s)

    def _set_pause(self, until_ms: int) -> None:
        self.service.ensure_topics()
        cfg = self.service.config
        set_pause(cfg.connection, cfg.control_topic, self.id, until_ms)

    def consumer(self, *, max_in_flight: int = 100, **options: Any) -> Consumer:
        """A consumer of this queue; see :class:`kmq.ConsumerConfig` for ``options``."""
        config = ConsumerConfig(max_in_flight=max_in_flight, **options)
        self.service.ensure_topics()
        return Consumer(self, config)

    def __repr__(self) -> str:
        return f"<kmq.Queue {self.id!r} on {self.service.config.queue_topic}>"


def _shows(watcher: ControlWatcher, topic: str, layout: TopicLayout) -> bool:
    return watcher.table.layout(topic) == layout


class Service:
    """Connection settings plus the shared producer. Arguments are those of
    :class:`kmq.ServiceConfig`; nothing connects until a producer or consumer is used."""

    def __init__(self, config: ServiceConfig | None = None, /, **settings: Any) -> None:
        if config is not None and settings:
            raise KmqError("pass either a ServiceConfig or keyword settings, not both")
        self.config = config if config is not None else ServiceConfig(**settings)
        self._lock = threading.Lock()
        self._queues: dict[str, Queue] = {}
        self._producer: KafkaProducer | None = None
        self._topics_ready = False
        self._partitions: dict[str, int] = {}
        self._watcher: ControlWatcher | None = None
        self._placement: dict[str, tuple[int, ...]] = {}
        self._placement_version = -1
        self._closed = False

    def queue(self, queue_id: str, policy: RetryPolicy | None = None) -> Queue:
        """The logical queue ``queue_id``; the same object for the same id.

        ``policy`` sets the queue's :class:`kmq.RetryPolicy` (default ``RetryPolicy()``);
        passing one for a queue that already has a different policy replaces it.
        """
        check_queue_id(queue_id)
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise ConfigError(f"policy must be a kmq.RetryPolicy, got {policy!r}")
        with self._lock:
            queue = self._queues.get(queue_id)
            if queue is None:
                queue = self._queues[queue_id] = Queue(self, queue_id, policy or RetryPolicy())
            elif policy is not None:
                queue.policy = policy
            return queue

    def ensure_topics(self) -> None:
        """Create the queue and markers topics if they are missing (when ``create_topics``)."""
        if self._topics_ready or not self.config.create_topics:
            return
        ensure_topics(self.config)
        self._topics_ready = True

    def kafka_producer(self) -> KafkaProducer:
        """The shared idempotent ``acks=all`` producer (created on first use)."""
        with self._lock:
            if self._closed:
                raise KmqError("service is closed")
            if self._producer is None:
                self.ensure_topics()
                self._producer = kafka_clients.producer(
                    self.config.connection,
                    "producer",
                    acks="all",
                    enable_idempotence=True,
                    linger_ms=0,  # a waiting send() goes out at once; busy ones batch
                    batch_size=kafka_clients.batch_bytes(self.config.max_message_bytes),
                    max_request_size=self.config.max_message_bytes,
                )
            return self._producer

    def control_watcher(self) -> ControlWatcher:
        """The shared reader of queue pauses (started on first use)."""
        self.ensure_topics()
        with self._lock:
            if self._watcher is None:
                self._watcher = ControlWatcher(self.config.connection, self.config.control_topic)
            return self._watcher

    def layout(self, topic: str | None = None) -> TopicLayout | None:
        """A topic's layout, the queue topic's by default (``None``: the kmq 0.1 layout,
        every queue everywhere)."""
        cfg = self.config
        return self.control_watcher().layout(
            topic or cfg.queue_topic, cfg.request_timeout_ms / 1000
        )

    def write_partitions(self, queue: str, topic: str | None = None) -> tuple[int, ...]:
        """The partitions ``queue``'s records are written to on a topic (the queue topic by
        default)."""
        if topic is not None and topic != self.config.queue_topic:
            return write_partitions(self.layout(topic), queue, self._partition_count(topic))
        watcher = self._watcher or self.control_watcher()
        if self._placement_version != watcher.version:
            self._placement = {}
            self._placement_version = watcher.version
        placed = self._placement.get(queue)
        if placed is None:
            placed = write_partitions(self.layout(), queue, self.queue_partition_count())
            self._placement[queue] = placed
        return placed

    def read_partitions(self, queue: str, topic: str | None = None) -> dict[int, int | None]:
        """The partitions ``queue``'s group reads on a topic (the queue topic by default),
        each with the offset it may stop at."""
        topic = topic or self.config.queue_topic
        return read_partitions(self.layout(topic), queue, self._partition_count(topic))

    def queue_partition_count(self) -> int:
        """How many partitions the queue topic has (looked up once)."""
        return self._partition_count(self.config.queue_topic)

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (looked up once)."""
        return self._partition_count(topic)

    def marker_partition_count(self) -> int:
        """How many partitions the markers topic has (looked up once)."""
        return self._partition_count(self.config.marker_topic)

    def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            producer = self.kafka_producer()
            deadline = time.monotonic() + self.config.request_timeout_ms / 1000
            while True:
                partitions = producer.partitions_for(topic)
                if partitions:
                    count = self._partitions[topic] = len(partitions)
                    break
                if time.monotonic() > deadline:
                    raise BrokerError(f"topic {topic!r} has no partitions")
                time.sleep(0.05)
        return count

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush and close the shared producer. Close consumers first."""
        with self._lock:
            self._closed = True
            producer, self._producer = self._producer, None
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.close()
        if producer is not None:
            producer.flush(timeout=timeout_s)
            producer.close(timeout=timeout_s)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
