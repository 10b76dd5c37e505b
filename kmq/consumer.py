"""Receiving from a logical queue: START before commit, keep-alives, ack and nack."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, MessageSizeTooLargeError
from kafka.structs import OffsetAndMetadata

from kmq.config import AT_MOST_ONCE, ConsumerConfig
from kmq.errors import (
    BrokerError,
    ConsumerClosedError,
    InvalidArgumentError,
    MessageStateError,
    MessageTooLargeError,
)
from kmq.marker_writer import MarkerWriter
from kmq.markers import Marker, MarkerType
from kmq.message import Message, State
from kmq.records import dead_letter_headers, parse_queue_headers

if TYPE_CHECKING:
    from kmq.service import Queue

log = logging.getLogger(__name__)


_FLUSH_AT = 256
"""Pending markers at which an ack(wait=False) flushes at once instead of leaving it to the
background loop (which flushes every poll, at most ``poll_timeout_ms`` later)."""


class _StartFailed(Exception):
    pass


class Consumer:
    """Receives one logical queue's messages. Use as a context manager, or call :meth:`close`.

    A background thread polls Kafka, writes each message's START marker (acknowledged by
    the broker) before committing its offset, keeps held messages alive with KEEPALIVE
    markers, and keeps polling with paused partitions while ``max_in_flight`` messages
    are held, so a slow application never costs the consumer its group membership.
    """

    def __init__(self, queue: Queue, config: ConsumerConfig) -> None:
        svc = queue.service
        self.queue = queue.id
        self.config = config
        self._svc_config = cfg = svc.config
        self._key = queue.id.encode()
        self._producer = svc.kafka_producer()
        self._lease_ms = cfg.redelivery_timeout_ms
        self._keepalive_s = cfg.redelivery_timeout_s * config.keepalive_fraction
        self._request_timeout_s = cfg.request_timeout_ms / 1000
        self._policy = queue.policy
        self._dead_letter_queue = queue.dead_letter_queue
        self._at_most_once = config.mode == AT_MOST_ONCE
        self._cond = threading.Condition()
        self._ready: deque[Message] = deque()
        self._held: dict[tuple[int, int], Message] = {}
        self._closed = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._next_tick = 0.0
        self._assigned: frozenset[int] = frozenset()
        self._paused = False
        self._pauses = svc.control_watcher()
        self._writer = MarkerWriter(
            cfg.marker_topic, svc.marker_partition_count(), cfg.max_message_bytes
        )
        self.group_id = config.group_id or f"kmq.{cfg.queue_topic}.{queue.id}"
        try:
            self._kc = KafkaConsumer(
                cfg.queue_topic,
                bootstrap_servers=cfg.bootstrap_servers,
                client_id=f"{cfg.client_id}-consumer",
                group_id=self.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=cfg.session_timeout_ms,
                heartbeat_interval_ms=max(100, cfg.session_timeout_ms // 4),
                request_timeout_ms=max(cfg.request_timeout_ms, cfg.session_timeout_ms + 5000),
                fetch_max_wait_ms=100,
                isolation_level="read_committed",  # a transactional tracker's aborted copies
            )
            self._txn: KafkaProducer | None = None
            if config.transactional:
                self._txn = KafkaProducer(
                    bootstrap_servers=cfg.bootstrap_servers,
                    client_id=f"{cfg.client_id}-txn",
                    transactional_id=f"{self.group_id}-{uuid.uuid4().hex[:12]}",
                    acks="all",
                    enable_idempotence=True,
                    max_request_size=cfg.max_message_bytes,
                    request_timeout_ms=cfg.request_timeout_ms,
                )
                self._txn.init_transactions()
        except KafkaError as exc:
            raise BrokerError(f"cannot start consumer for queue {queue.id!r}: {exc}") from exc
        self._thread = threading.Thread(
            target=self._run, name=f"kmq-consumer-{queue.id}", daemon=True
        )
        self._thread.start()

    # -- application side -------------------------------------------------------------

    def receive(self, timeout_s: float | None = 1.0) -> Message | None:
        """The next message, or ``None`` if none arrives within ``timeout_s``.

        ``timeout_s=0`` never blocks; ``None`` waits indefinitely. Raises
        :class:`kmq.ConsumerClosedError` once the consumer is closed or its loop failed.
        """
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0
        ):
            raise InvalidArgumentError(f"timeout_s must be >= 0 or None, got {timeout_s!r}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise ConsumerClosedError(f"consumer of queue {self.queue!r} is closed")
                if self._ready and not self._paused:
                    message = self._ready.popleft()
                    message._state = State.HELD
                    return message
                if self._error is not None:
                    raise ConsumerClosedError(
                        f"consumer of queue {self.queue!r} failed: {self._error!r}"
                    ) from self._error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def __iter__(self) -> Iterator[Message]:
        """Yield messages until the consumer is closed."""
        while True:
            try:
                message = self.receive(timeout_s=1.0)
            except ConsumerClosedError:
                if self._error is not None:
                    raise
                return
            if message is not None:
                yield message

    @property
    def in_flight(self) -> int:
        """Messages started but not yet settled: buffered plus handed out."""
        with self._cond:
            return len(self._held)

    def assignment(self) -> frozenset[int]:
        """Queue-topic partitions this consumer owned at its last poll (empty before it joins)."""
        return self._assigned

    def close(self, timeout_s: float = 30.0) -> None:
        """Release every unsettled message for immediate redelivery and leave the group."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._stop.set()
        self._thread.join()
        with self._cond:
            for message in self._held.values():
                if message._state is State.HELD:
                    self._send(MarkerType.NACK, message, 0, "released: consumer closed")
                else:
                    self._send(MarkerType.RELEASE, message, 0, "released unseen: consumer closed")
                message._state = State.RELEASED
            self._held.clear()
            self._ready.clear()
            self._writer.flush(self._producer)
        try:
            self._producer.flush(timeout=timeout_s)
        finally:
            self._kc.close(autocommit=False)
            if self._txn is not None:
                self._txn.close(timeout=timeout_s)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _settle(
        self, message: Message, state: State, delay_ms: int | None, reason: str, wait: bool
    ) -> None:
        verb = state.value[:-2]
        with self._cond:
            if message._state is not State.HELD:
                raise MessageStateError(f"cannot {verb} {message!r}: already settled")
            if self._at_most_once:
                if state is not State.ACKED:
                    raise MessageStateError(
                        f"cannot {verb} {message!r}: at-most-once messages are never redelivered"
                    )
                message._state = state
                return
            self._held.pop((message.partition, message.offset), None)
            message._state = state
            futures: list[Any] = []
            if state is State.ACKED:
                self._send(MarkerType.END, message, 0, "")
            elif state is State.NACKED:
                if delay_ms is None:
                    delay_ms = round(
                        1000 * self._policy.backoff_s(message.attempt, self.config.rng)
                    )
                self._send(MarkerType.NACK, message, delay_ms, reason)
            if wait or self._writer.pending >= _FLUSH_AT:
                try:
                    flushed = self._writer.flush(self._producer)
                except KafkaError as exc:
                    raise BrokerError(
                        f"{verb} of {message.id} not written ({exc!r}); the message will be "
                        "redelivered when its lease runs out"
                    ) from exc
                futures = flushed.get(message.marker_partition, [])
        if state is State.REJECTED:
            futures = self._dead_letter(message, reason)
        if wait:
            try:
                for future in futures:
                    future.get(timeout=self._request_timeout_s)
            except KafkaError as exc:
                raise BrokerError(
                    f"{state.value[:-2]} of {message.id} not written ({exc!r}); the message "
                    "will be redelivered when its lease runs out"
                ) from exc

    # -- background loop --------------------------------------------------------------

    def _run(self) -> None:
        backoff_s = 0.1
        try:
            while not self._stop.is_set():
                self._keepalive_tick()
                self._check_pause()
                room = 0 if self._paused else self._room()
                self._apply_backpressure(room)
                try:
                    with self._cond:
                        if self._writer.pending:  # acks made with wait=False, keep-alives
                            self._writer.flush(self._producer)
                    records = self._kc.poll(
                        timeout_ms=self.config.poll_timeout_ms, max_records=max(room, 1)
                    )
                    if records:
                        self._start(records)
                    backoff_s = 0.1
                except (KafkaError, _StartFailed) as exc:
                    log.warning("queue %r: %r; retrying in %.1f s", self.queue, exc, backoff_s)
                    self._stop.wait(backoff_s)
                    backoff_s = min(backoff_s * 2, 5.0)
        except BaseException as exc:  # surfaced to the application by receive()
            log.exception("queue %r: consumer loop failed", self.queue)
            self._error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def _check_pause(self) -> None:
        paused = bool(self._pauses.paused_until_ms(self.queue))
        if paused != self._paused:
            log.info("queue %r %s", self.queue, "paused" if paused else "resumed")
            with self._cond:
                self._paused = paused
                self._cond.notify_all()

    def _room(self) -> int:
        with self._cond:
            unsettled = len(self._ready) if self._at_most_once else len(self._held)
            return self.config.max_in_flight - unsettled

    def _apply_backpressure(self, room: int) -> None:
        assigned = self._kc.assignment()
        self._assigned = frozenset(tp.partition for tp in assigned)
        if room <= 0:
            unpaused = assigned - self._kc.paused()
            if unpaused:
                self._kc.pause(*unpaused)
        else:
            paused = self._kc.paused()
            if paused:
                self._kc.resume(*paused)

    def _start(self, records: dict[TopicPartition, list[Any]]) -> None:
        commits: dict[TopicPartition, OffsetAndMetadata] = {}
        firsts: dict[TopicPartition, int] = {}
        messages: list[Message] = []
        for tp, batch in records.items():
            if not batch:
                continue
            firsts[tp] = batch[0].offset
            commits[tp] = OffsetAndMetadata(batch[-1].offset + 1, "", -1)
            messages.extend(self._message(r) for r in batch if r.key == self._key)
        txn = self._txn
        futures: list[Any] = []
        try:
            if not self._at_most_once and messages:
                with self._cond:
                    if txn is not None:
                        # Other markers must not ride in (and die with) an aborted transaction.
                        self._writer.flush(self._producer)
                        txn.begin_transaction()
                    for message in messages:
                        self._writer.add(self._start_marker(message), message.marker_partition)
                    for batch_futures in self._writer.flush(txn or self._producer).values():
                        futures.extend(batch_futures)
            if txn is not None:
                if not messages:
                    txn.begin_transaction()
                txn.send_offsets_to_transaction(commits, self._kc.group_metadata())
                txn.commit_transaction()
            for future in futures:
                future.get(timeout=self._request_timeout_s)
        except KafkaError as exc:
            if txn is not None:
                with contextlib.suppress(KafkaError):
                    txn.abort_transaction()
            # Nothing was handed out or committed: read the batch again and retry its STARTs.
            for tp, offset in firsts.items():
                # A partition revoked meanwhile raises here; its new owner re-reads it anyway.
                with contextlib.suppress(Exception):
                    self._kc.seek(tp, offset)
            if isinstance(exc, MessageSizeTooLargeError):
                # Retrying cannot help, and the record would block its partition for good:
                # fail loudly (receive() raises) and leave the record for a consumer that fits.
                raise MessageTooLargeError(
                    f"queue {self.queue!r}: a START marker was refused as too large ({exc}); "
                    "consumers, the tracker and the markers topic must allow what producers "
                    f"send (this consumer's max_message_bytes is "
                    f"{self._svc_config.max_message_bytes})"
                ) from exc
            raise _StartFailed(f"START marker not acknowledged: {exc!r}") from exc
        if txn is None:
            try:
                self._kc.commit(commits)
            except KafkaError as exc:
                if self._at_most_once:
                    messages = self._committed_anyway(commits, firsts, messages, exc)
                    if not messages:
                        raise _StartFailed(f"offset commit failed: {exc!r}") from exc
                    self._hand_out(messages)
                    return
                log.warning(
                    "queue %r: offset commit failed (%r); these %d messages may also be "
                    "delivered to the partition's next owner",
                    self.queue, exc, len(messages),
                )  # fmt: skip
        # Committed before handing out, so a consumer that dies holding a message never has
        # its record read again: the tracker redelivers it, counting the attempt.
        self._hand_out(messages)

    def _committed_anyway(
        self,
        commits: dict[TopicPartition, OffsetAndMetadata],
        firsts: dict[TopicPartition, int],
        messages: list[Message],
        exc: KafkaError,
    ) -> list[Message]:
        """At-most-once, after a failed offset commit: which messages may still be handed out.

        A commit can land and still report failure (a lost answer), so ask the group what it
        holds. A partition still assigned whose commit landed is ours to hand out (once); one
        whose commit did not is read again from the committed offset, so a failed commit loses
        nothing.
        If even that cannot be told, the partition's messages are dropped, never doubled.
        """
        landed: set[int] = set()
        for tp, meta in commits.items():
            try:
                committed = self._kc.committed(tp)
            except KafkaError as err:
                log.error(
                    "queue %r: offset commit failed (%r) and the committed offset of %s is "
                    "unknown (%r): its messages are dropped (at-most-once)",
                    self.queue, exc, tp, err,
                )  # fmt: skip
                continue
            if committed == meta.offset and tp in self._kc.assignment():
                # Ours, and committed exactly up to this batch (further on would mean a new
                # owner has read and committed it already).
                landed.add(tp.partition)
                continue
            # A partition revoked meanwhile raises here; its new owner reads it anyway.
            with contextlib.suppress(Exception):
                self._kc.seek(tp, committed if committed is not None else firsts[tp])
        return [m for m in messages if m.partition in landed]

    def _hand_out(self, messages: list[Message]) -> None:
        if not messages:
            return
        next_keepalive = time.monotonic() + self._keepalive_s
        with self._cond:
            for message in messages:
                message.next_keepalive = next_keepalive
                if not self._at_most_once:
                    self._held[(message.partition, message.offset)] = message
                self._ready.append(message)
            self._cond.notify_all()

    def _message(self, record: Any) -> Message:
        message_id, attempt, headers = parse_queue_headers(record.headers)
        message = Message(
            self,
            payload=record.value or b"",
            message_id=message_id or f"ext-{record.partition}-{record.offset}",
            queue=self.queue,
            attempt=attempt,
            headers=dict(headers),
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp,
        )
        message.marker_partition = self._writer.partition_for(message.id)
        return message

    def _dead_letter(self, message: Message, reason: str) -> list[Any]:
        """Write ``message`` to the dead-letter queue, then its DEAD_LETTERED marker."""
        copy = self._producer.send(
            self._svc_config.queue_topic,
            key=self._dead_letter_queue.encode(),
            value=message.payload,
            headers=dead_letter_headers(
                message.id, self.queue, message.attempt, reason, tuple(message.headers.items())
            ),
            partition=message.partition,
        )
        try:
            copy.get(timeout=self._request_timeout_s)
        except KafkaError as exc:
            raise BrokerError(
                f"dead letter for {message.id} not written ({exc!r}); the message will be "
                "redelivered when its lease runs out"
            ) from exc
        with self._cond:
            self._send(MarkerType.DEAD_LETTERED, message, 0, reason)
            return self._writer.flush(self._producer).get(message.marker_partition, [])

    def _start_marker(self, message: Message) -> Marker:
        return Marker(
            type=MarkerType.START,
            queue=self.queue,
            partition=message.partition,
            offset=message.offset,
            message_id=message.id,
            attempt=message.attempt,
            redeliver_after_ms=self._lease_ms,
            key=self._key,
            value=message.payload,
            headers=tuple(message.headers.items()),
            max_attempts=self._policy.max_attempts,
            dead_letter_queue=self._dead_letter_queue,
        )

    def _keepalive_tick(self) -> None:
        now = time.monotonic()
        if now < self._next_tick:
            return
        self._next_tick = now + min(0.05, self._keepalive_s / 4)
        with self._cond:
            for message in self._held.values():
                if message.next_keepalive <= now:
                    self._send(MarkerType.KEEPALIVE, message, self._lease_ms, "")
                    message.next_keepalive = now + self._keepalive_s

    def _send(self, kind: MarkerType, message: Message, after_ms: int, reason: str) -> None:
        """Queue a marker for ``message``. Callers hold ``_cond``, so markers of one message
        reach the writer, and so the broker, in the order they were decided."""
        marker = Marker(
            type=kind,
            queue=self.queue,
            partition=message.partition,
            offset=message.offset,
            message_id=message.id,
            attempt=message.attempt,
            redeliver_after_ms=after_ms,
            reason=reason,
        )
        self._writer.add(marker, message.marker_partition)
