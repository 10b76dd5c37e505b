"""Sending messages to a logical queue."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kafka.errors import KafkaError

from kmq import metrics
from kmq.errors import BrokerError, KmqError, MessageTooLargeError, SendFailedError
from kmq.records import new_message_id, queue_headers, record_size
from kmq.validation import check_headers, check_payload

if TYPE_CHECKING:
    from kmq.service import Queue

# Anything this far under the limit cannot overflow it, headers or not.
_SLACK_BYTES = 4096
# How many wait=False sends apart the answered ones are swept out, and how many are kept
# at least before all of them are looked at (see Producer._sweep).
_SWEEP_EVERY = 512
_COMPACT_AT = 8 * _SWEEP_EVERY


class Producer:
    """Sends to one logical queue. Cheap to create; all producers of a Service share one
    thread-safe Kafka producer (idempotent, ``acks=all``), so ``send()`` calls from several
    threads share broker round trips."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._service = queue.service
        self._key = queue.id.encode()
        self._topic = self._service.config.queue_topic
        self._limit = self._service.config.max_message_bytes
        self._timeout_s = self._service.config.request_timeout_ms / 1000
        self._rr = itertools.count(random.randrange(1 << 16))
        self._kp: Any = None
        self._metrics = metrics.for_queue(self._service.config.metrics, queue.id)
        self._failed: dict[str, BaseException] = {}
        """``wait=False`` sends the broker never took, by message id, until flush() says so
        (only a sweep, under ``_sweep_lock``, touches it)."""
        self._unswept: deque[tuple[str, Any]] = deque()
        """``wait=False`` sends in the order they were made, with their futures, until
        :meth:`_sweep` finds them answered. An errback on every future cost about 0.8 µs
        per message, against 0.04 µs for this."""
        self._sweep_lock = threading.Lock()
        self._compact_at = _COMPACT_AT
        self._sends = 0

    def send(
        self, payload: bytes, headers: Mapping[str, bytes] | None = None, *, wait: bool = True
    ) -> str:
        """Enqueue ``payload`` and return its message id.

        With ``wait=True`` (the default) this returns once the broker has the record. With
        ``wait=False`` it returns at once; call :meth:`flush` before relying on delivery: it
        raises :class:`SendFailedError` naming every such message the broker did not take.
        Bad input raises before anything is written.
        """
        body, user_headers = self._checked(payload, headers)
        message_id = new_message_id()
        future = self._write(message_id, body, user_headers, wait=wait)
        if not wait:
            self._unswept.append((message_id, future))
            self._sends += 1  # racy between threads: it only spaces the sweeps out
            if not self._sends % _SWEEP_EVERY:
                self._sweep()
        if self._metrics is not None:
            self._metrics.sent.inc()
        return message_id

    def send_many(
        self, items: Sequence[tuple[bytes, Mapping[str, bytes] | None]]
    ) -> list[str | KmqError]:
        """Send every ``(payload, headers)`` pipelined: all are written without waiting,
        then each is awaited. Returns, in order, each one's message id once the broker has
        it, or the error that item failed with; one item failing stops no other."""
        pending: list[tuple[str, Any] | KmqError] = []
        for payload, headers in items:
            try:
                body, user_headers = self._checked(payload, headers)
                message_id = new_message_id()
                pending.append((message_id, self._write(message_id, body, user_headers,
                                                        wait=False)))  # fmt: skip
            except KmqError as exc:
                pending.append(exc)
        deadline = time.monotonic() + self._timeout_s
        out: list[str | KmqError] = []
        for item in pending:
            if isinstance(item, KmqError):
                out.append(item)
                continue
            message_id, future = item
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except KafkaError as exc:
                out.append(BrokerError(f"send to queue {self._queue.id!r} failed: {exc}"))
            else:
                out.append(message_id)
        if self._metrics is not None:
            self._metrics.sent.inc(sum(isinstance(item, str) for item in out))
        return out

    def _checked(
        self, payload: bytes, headers: Mapping[str, bytes] | None
    ) -> tuple[bytes, Sequence[tuple[str, bytes]]]:
        """The payload and headers to write, or an error if they may not be sent."""
        body = payload if type(payload) is bytes else check_payload(payload)
        user_headers = check_headers(headers) if headers else ()
        rough = len(body)
        for name, value in user_headers:
            rough += len(name) * 4 + len(value) + 16  # varints of each header
        if rough + _SLACK_BYTES > self._limit:
            self._check_size(body, user_headers)
        return body, user_headers

    def _write(
        self,
        message_id: str,
        body: bytes,
        headers: Sequence[tuple[str, bytes]],
        *,
        wait: bool,
        attempt: int = 1,
    ) -> Any:
        partitions = self._service.write_partitions(self._queue.id)
        try:
            if self._kp is None:
                self._kp = self._service.kafka_producer()
            future = self._kp.send(
                self._topic,
                key=self._key,
                value=body,
                headers=queue_headers(message_id, attempt, headers),
                partition=partitions[next(self._rr) % len(partitions)],
            )
            if wait:
                future.get(timeout=self._timeout_s)
        except KafkaError as exc:
            raise BrokerError(f"send to queue {self._queue.id!r} failed: {exc}") from exc
        return future

    def _sweep(self, everything: bool = False) -> dict[str, BaseException]:
        """Forget the ``wait=False`` sends the broker has answered, keeping the failed ones
        for :meth:`flush`. Records are answered about in the order they were sent, so
        this mostly pops answered ones off the front, up to the first still unanswered:
        constant work per send. Should that one stay unanswered (its partition's leader
        gone, for up to the delivery timeout), all are looked at once they have doubled,
        so answered ones are not kept: still constant work per send. One thread sweeps
        at a time: another finding it busy goes on, unless ``everything`` (all are
        looked at; :meth:`flush` waits for that, and gets the failures found since the last
        such sweep)."""
        if not self._sweep_lock.acquire(blocking=everything):
            return {}
        try:
            unswept = self._unswept  # other threads append on the right meanwhile
            while unswept and unswept[0][1].is_done:
                self._settled(*unswept.popleft())
            if everything or len(unswept) >= self._compact_at:
                for _ in range(len(unswept)):  # each one once, unanswered ones put back
                    item = unswept.popleft()
                    if item[1].is_done:
                        self._settled(*item)
                    else:
                        unswept.append(item)
                self._compact_at = max(_COMPACT_AT, 2 * len(unswept))
            if everything:
                failed, self._failed = self._failed, {}
                return failed
            return {}
        finally:
            self._sweep_lock.release()

    def _settled(self, message_id: str, future: Any) -> None:
        if future.exception is not None:
            self._failed[message_id] = future.exception

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every message sent with ``wait=False`` has reached the broker.

        Raises :class:`SendFailedError` if any of them (since the last flush) failed: those
        messages are not in the queue, and sending them again is up to the caller."""
        try:
            self._service.kafka_producer().flush(timeout=timeout_s)
        except KafkaError as exc:
            raise BrokerError(f"flush failed: {exc}") from exc
        failed = self._sweep(everything=True)  # every send before the flush is answered now
        if failed:
            raise SendFailedError(self._queue.id, failed)

    def _check_size(self, body: bytes, headers: Sequence[tuple[str, bytes]]) -> None:
        size = record_size(self._key, body, headers)
        if size > self._limit:
            raise MessageTooLargeError(
                f"a payload of {len(body)} bytes makes a record of up to {size} bytes, over "
                f"the {self._limit}-byte limit (max_message_bytes); store large bodies "
                "elsewhere and send a reference"
            )
