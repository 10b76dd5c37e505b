"""Sending messages to a logical queue."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kafka.errors import KafkaError

from kmq.errors import BrokerError, MessageTooLargeError
from kmq.records import new_message_id, queue_headers, start_marker_record_size
from kmq.validation import check_headers, check_payload

if TYPE_CHECKING:
    from kmq.service import Queue

# Protobuf adds a few bytes per field; anything this far under the limit cannot overflow it.
_SLACK_BYTES = 4096
# A repeated Header costs up to three tags and three length varints on top of its name and value.
_HEADER_OVERHEAD_BYTES = 20


class Producer:
    """Sends to one logical queue. Cheap to create; all producers of a Service share one
    thread-safe Kafka producer (idempotent, ``acks=all``)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._service = queue.service
        self._key = queue.id.encode()
        self._rr = itertools.count(random.randrange(1 << 16))

    def send(
        self, payload: bytes, headers: Mapping[str, bytes] | None = None, *, wait: bool = True
    ) -> str:
        """Enqueue ``payload`` and return its message id.

        With ``wait=True`` (the default) this returns once the broker has the record. With
        ``wait=False`` it returns at once; call :meth:`flush` before relying on delivery.
        Bad input raises before anything is written.
        """
        body = check_payload(payload)
        user_headers = check_headers(headers)
        message_id = new_message_id()
        self._check_size(message_id, body, user_headers)
        self._write(message_id, body, user_headers, wait=wait)
        return message_id

    def _write(
        self,
        message_id: str,
        body: bytes,
        headers: tuple[tuple[str, bytes], ...],
        *,
        wait: bool,
    ) -> None:
        kp = self._service.kafka_producer()
        partitions = self._service.queue_partition_count()
        future = kp.send(
            self._service.config.queue_topic,
            key=self._key,
            value=body,
            headers=queue_headers(message_id, 1, headers),
            partition=next(self._rr) % partitions,
        )
        if wait:
            try:
                future.get(timeout=self._service.config.request_timeout_ms / 1000)
            except KafkaError as exc:
                raise BrokerError(f"send to queue {self._queue.id!r} failed: {exc}") from exc

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every message sent with ``wait=False`` has reached the broker."""
        try:
            self._service.kafka_producer().flush(timeout=timeout_s)
        except KafkaError as exc:
            raise BrokerError(f"flush failed: {exc}") from exc

    def _check_size(
        self, message_id: str, body: bytes, headers: tuple[tuple[str, bytes], ...]
    ) -> None:
        limit = self._service.config.max_message_bytes
        rough = (
            len(body)
            + sum(len(k.encode()) + len(v) + _HEADER_OVERHEAD_BYTES for k, v in headers)
            + 2 * len(self._key)
        )
        if rough + _SLACK_BYTES <= limit:
            return
        size = start_marker_record_size(self._queue.id, message_id, body, headers)
        if size > limit:
            raise MessageTooLargeError(
                f"payload of {len(body)} bytes needs a {size}-byte START marker, over the "
                f"{limit}-byte limit (max_message_bytes); store large bodies elsewhere "
                "and send a reference"
            )
