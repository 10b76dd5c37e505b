"""The SDK's Prometheus metrics, kept only when asked for: ``ServiceConfig(metrics=registry)``
with a ``prometheus_client.CollectorRegistry`` (``prometheus_client.REGISTRY`` for the
process-wide one). Without it nothing here runs and prometheus_client is not imported.

Every metric has a ``queue`` label: ``kmq_messages_sent_total``,
``kmq_messages_received_total``, ``kmq_messages_acked_total``, ``kmq_messages_nacked_total``,
``kmq_messages_rejected_total``, ``kmq_message_processing_seconds`` (from ``receive()``
handing a message out to its ack, nack or reject), ``kmq_keepalives_total`` (KEEPALIVE
markers written) and ``kmq_messages_in_flight`` (started and not settled, read from the
live consumers at scrape time).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client.core import Metric
    from prometheus_client.registry import CollectorRegistry

    from kmq.message import Message, State

PROCESSING_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _HasInFlight(Protocol):
    queue: str

    @property
    def in_flight(self) -> int: ...


class QueueMetrics:
    """One queue's metric children, resolved once (no label lookup per message)."""

    def __init__(self, family: SdkMetrics, queue: str) -> None:
        self.sent = family.sent.labels(queue)
        self.received = family.received.labels(queue)
        self.acked = family.acked.labels(queue)
        self.nacked = family.nacked.labels(queue)
        self.rejected = family.rejected.labels(queue)
        self.processing = family.processing.labels(queue)
        self.keepalives = family.keepalives.labels(queue)
        self._family = family

    def watch(self, consumer: _HasInFlight) -> None:
        """Count ``consumer``'s in-flight messages while it lives."""
        self._family.consumers.add(consumer)

    def taken(self, messages: Iterable[Message]) -> None:
        """``receive()`` handed these out."""
        now = time.monotonic()
        count = 0
        for message in messages:
            message._taken_at = now
            count += 1
        self.received.inc(count)

    def settled(self, message: Message, state: State) -> None:
        name = state.name
        counter = self.acked if name == "ACKED" else self.nacked if name == "NACKED" else (
            self.rejected if name == "REJECTED" else None
        )  # fmt: skip
        if counter is None:
            return
        counter.inc()
        taken_at = getattr(message, "_taken_at", None)
        if taken_at is not None:
            self.processing.observe(time.monotonic() - taken_at)


class SdkMetrics:
    """The ``kmq_*`` metric families in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, ["queue"], registry=registry)

        self.sent = counter("kmq_messages_sent", "Messages the broker has taken from send().")
        self.received = counter("kmq_messages_received", "Messages receive() handed out.")
        self.acked = counter("kmq_messages_acked", "Messages acked.")
        self.nacked = counter("kmq_messages_nacked", "Messages nacked (redelivered later).")
        self.rejected = counter("kmq_messages_rejected", "Messages rejected (dead-lettered).")
        self.keepalives = counter("kmq_keepalives", "KEEPALIVE markers written.")
        self.processing = Histogram(
            "kmq_message_processing_seconds",
            "From receive() handing a message out to its ack, nack or reject.",
            ["queue"],
            registry=registry,
            buckets=PROCESSING_BUCKETS_S,
        )
        self.consumers: weakref.WeakSet[_HasInFlight] = weakref.WeakSet()
        registry.register(_InFlightCollector(self.consumers))
        self._queues: dict[str, QueueMetrics] = {}
        self._lock = threading.Lock()

    def queue(self, queue: str) -> QueueMetrics:
        with self._lock:
            found = self._queues.get(queue)
            if found is None:
                found = self._queues[queue] = QueueMetrics(self, queue)
            return found


class _InFlightCollector:
    def __init__(self, consumers: weakref.WeakSet[_HasInFlight]) -> None:
        self._consumers = consumers

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "kmq_messages_in_flight",
            "Messages started and not settled (buffered or held), by queue.",
            labels=["queue"],
        )
        totals: dict[str, int] = {}
        for consumer in list(self._consumers):
            totals[consumer.queue] = totals.get(consumer.queue, 0) + consumer.in_flight
        for queue, count in sorted(totals.items()):
            family.add_metric([queue], count)
        yield family


_families: weakref.WeakKeyDictionary[CollectorRegistry, SdkMetrics] = weakref.WeakKeyDictionary()
_families_lock = threading.Lock()


def for_queue(registry: CollectorRegistry | None, queue: str) -> QueueMetrics | None:
    """``queue``'s metrics in ``registry``; None (metrics off) without one. Services that
    share a registry share its metric families."""
    if registry is None:
        return None
    with _families_lock:
        family = _families.get(registry)
        if family is None:
            family = _families[registry] = SdkMetrics(registry)
    return family.queue(queue)
