"""Receiving from a logical queue: START before commit, keep-alives, ack and nack.

The consumer is an adapter around two pure cores (:mod:`kmq.leases`): ``Leases`` (every
message from its START to its settling, in keep-alive order) and ``BatchCycle`` (polled
batches on their way out). Three threads meet here:

* the poll thread owns the KafkaConsumer: it polls, adds each batch's STARTs to the marker
  writer, commits a batch once its STARTs are on the broker (``commit_async``), and hands
  its messages out once that commit is over. Batches overlap: the next batch's STARTs go out
  while the previous commit is in flight;
* the marker writer's thread sends markers (:mod:`kmq.marker_writer`);
* application threads call :meth:`Consumer.receive` and settle messages.

``_cond`` guards the consumer's state and is never held across a broker call: under it,
markers are only appended to the writer, which keeps the markers of one message in the
order they were decided.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from types import TracebackType
from typing import TYPE_CHECKING, Any
from zlib import crc32

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError
from kafka.structs import MemberState, OffsetAndMetadata

from kmq import kafka_clients, metrics, txn_wait
from kmq.adopted import Adopted
from kmq.assignor import LayoutAssignor
from kmq.config import AT_MOST_ONCE, EAGER, MAX_REDELIVERY_TIMEOUT_S, ConsumerConfig
from kmq.continuity import Continuity
from kmq.errors import (
    BrokerError,
    ConsumerClosedError,
    InvalidArgumentError,
    MessageStateError,
)
from kmq.layout import retry_reads, spare_candidates
from kmq.leases import Actions, Batch, BatchCycle, Leases
from kmq.marker_writer import Flush, Headers, MarkerWriter
from kmq.markers import QUEUE_LANE, RETRY_LANE, Entry, MarkerType, encode_entries
from kmq.message import Message, State
from kmq.reads import READS_HEADER, encode_reads
from kmq.rebalances import GivenUp
from kmq.receipts import Receipt
from kmq.records import ID_HEADER, dead_letter_headers, delivery_key, parse_queue_headers

if TYPE_CHECKING:
    from kmq.service import Queue

log = logging.getLogger(__name__)

_START = int(MarkerType.START)
_KEEPALIVE = int(MarkerType.KEEPALIVE)
_END = int(MarkerType.END)
_HERE: Entry = (int(MarkerType.PROBE), 0, 0, 0, 0, 0, 0, 0)
"""A consumer's "still here": a PROBE of no tracker's (nonce 0), written only for the
``kmq.reads`` header its record carries (see ``Consumer._announce``)."""
_ANNOUNCE_S = 0.4
"""How often a consumer reading retry partitions says so on every markers partition it wrote
nothing to meanwhile: well within the trackers' 1 s (``tracker.readers.FRESH_S``)."""
_NACK = int(MarkerType.NACK)
_RELEASE = int(MarkerType.RELEASE)
_DEAD_LETTERED = int(MarkerType.DEAD_LETTERED)

_LAYOUT_CHECK_S = 1.0
_TXN_TIMEOUT_MS = 10_000
"""A transactional consumer's transaction timeout, and how long it waits for its offset
commit, commit or abort to be answered. A consumer killed inside its START transaction leaves
it open, and every markers partition it wrote to is read no further (trackers read
committed) until the broker aborts it, this long after it began (plus up to 10 s of the
broker's cleanup interval, on Apache Kafka); kafka-python's default is 60 s. A transaction of
STARTs takes milliseconds; one not over in this time fails, and its batch is read again."""
_JOIN_POLL_MS = 100
_RETRY_POLL_S = 0.01
"""How soon the retry lane is polled again after copies came from it."""
_RETRY_POLL_MAX_S = 0.1
"""How often it is polled at least: the wait doubles from ``_RETRY_POLL_S`` up to this while
nothing comes (and starts over when its partitions change). A poll costs kafka-python 3.0.12
about 0.4 ms of CPU even when it returns nothing (measured); with this, draining a one-queue
backlog took a third fewer polls and about a fifth less consumer CPU per message. A copy that
comes after a quiet spell waits up to 0.1 s for its poll."""

TP = TopicPartition
CycleBatch = Batch[TopicPartition, Message]


class _StartFailed(Exception):
    pass


def _lease(seconds: object) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgumentError(f"lease_s must be a number of seconds, got {seconds!r}")
    if not 0 < seconds <= MAX_REDELIVERY_TIMEOUT_S:  # also rejects NaN and infinities
        raise InvalidArgumentError(
            f"lease_s must be > 0 and <= {MAX_REDELIVERY_TIMEOUT_S:g} s, got {seconds!r}"
        )
    return max(1, round(seconds * 1000))


class Consumer:
    """Receives one logical queue's messages. Use as a context manager, or call :meth:`close`.

    A background thread polls Kafka, writes each message's START marker (acknowledged by
    the broker) before committing its offset, keeps messages alive with KEEPALIVE markers
    until they are settled, and keeps polling with paused partitions while
    ``max_in_flight`` messages are unsettled, so a slow application never costs the
    consumer its group membership.
    """

    _retry_poll_s = _RETRY_POLL_S
    """The wait before the retry lane's next poll (see ``_RETRY_POLL_MAX_S``)."""

    def __init__(self, queue: Queue, config: ConsumerConfig) -> None:
        svc = queue.service
        self.queue = queue.id
        self.config = config
        self._svc = svc
        self._svc_config = cfg = svc.config
        self._topic = cfg.queue_topic
        self._retry_topic = cfg.retry_topic
        self._lanes = {cfg.queue_topic: QUEUE_LANE, cfg.retry_topic: RETRY_LANE}
        self._key = queue.id.encode()
        self._producer = svc.kafka_producer()
        self._lease_ms = cfg.redelivery_timeout_ms
        self._keepalive_s = cfg.redelivery_timeout_s * config.keepalive_fraction
        self._request_timeout_s = cfg.request_timeout_ms / 1000
        self._policy = queue.policy
        self._dead_letter_queue = queue.dead_letter_queue
        self._dlq_text = (queue.policy.dead_letter_queue or "").encode()
        self._at_most_once = config.mode == AT_MOST_ONCE
        self._metrics = metrics.for_queue(cfg.metrics, queue.id)  # None: metrics off
        if self._metrics is not None:
            self._metrics.watch(self)
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._room_freed = threading.Condition(lock)
        self._starved = False
        # A polled batch is at most half of max_in_flight: the application works on one
        # while the next goes through START and commit.
        self._batch_max = max(1, config.max_in_flight // 2)
        self._ready: deque[Message] = deque()
        self._ready_retry: deque[Message] = deque()
        """Redelivered copies: handed out before anything from the queue topic."""
        # The last tenth of max_in_flight is kept for the retry lane: with the queue topic
        # backed up, a copy is still fetched (and handed out first) at once.
        self._reserve = config.max_in_flight // 10
        self._next_retry_poll = 0.0
        self._leases: Leases[int, Message] = Leases(self._keepalive_s)
        self._closed = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._next_tick = 0.0
        self._next_layout_check = 0.0
        self._assigned: frozenset[int] = frozenset()
        self._paused = False
        self._pauses = svc.control_watcher()
        self._marker_partitions = svc.marker_partition_count()
        self._progress = threading.Event()
        """Set when a flush or an offset commit is over: the batch cycle can move on."""
        self._reads: Headers = []
        """Says what this consumer's retry lane reads, on every marker record it writes
        (:mod:`kmq.reads`): the tracker sends copies to partitions someone reads now."""
        self._writer = MarkerWriter(
            self._producer,
            cfg.marker_topic,
            self._marker_partitions,
            cfg.max_message_bytes,
            linger_s=config.poll_timeout_ms / 1000,
            name=f"kmq-markers-{queue.id}",
            on_flushed=self._progress.set,
            headers=lambda: self._reads,
        )
        self._cycle: BatchCycle[TopicPartition, Message] = BatchCycle()
        self._continuity: Continuity[TopicPartition] = Continuity()
        self._starting: list[tuple[CycleBatch, Flush, frozenset[int]]] = []
        self._committing: list[tuple[CycleBatch, Any]] = []
        """Batches whose offsets are being committed, with the commit's future (``None``
        while it waits for the commit in flight on its Kafka consumer: see _send_commits)."""
        self.group_id = config.group_id or f"kmq.{cfg.queue_topic}.{queue.id}"
        self._read: dict[int, int | None] = {}
        self._declared: frozenset[int] = frozenset()
        self._retry_read: frozenset[int] = frozenset()
        """Retry-topic partitions the queue's consumers read between them."""
        self._retry_reading: frozenset[int] = frozenset()
        """Those of them this consumer reads (assigned to its retry-lane reader)."""
        self._spare_candidates: frozenset[int] = frozenset()
        """Retry-topic partitions the queue's consumers read only as spares
        (:func:`kmq.layout.spare_candidates`)."""
        self._spares: frozenset[int] = frozenset()
        """The spares the group's leader gave this consumer at its last join."""
        self._spares_reading: frozenset[int] = frozenset()
        """Those it reads (still candidates)."""
        self._adopted = Adopted(hold_s=2 * cfg.session_timeout_ms / 1000)
        """Retry partitions it reads while no other consumer of the queue does (kmq.adopted)."""
        self._noticed: frozenset[int] = frozenset()
        self._notices_version = -1
        self._next_announce = 0.0
        self._queue_window: tuple[int, ...] = ()
        self._retry_window: tuple[int, ...] = ()
        self._legacy_done: set[int] = set()
        self._layout_version = -1
        self._given_up = GivenUp()
        try:
            # Two Kafka consumers: the queue group's member, and the retry lane's reader,
            # which is in no group (see _follow_queue_partitions). Apart, each can be paused
            # as a whole, and the retry lane is read first.
            self._kc = self._queue_group_member()
            self._rc = kafka_clients.consumer(
                cfg.connection,
                "retry-consumer",
                # Only where its offsets are kept: it never joins this group, so its commits
                # are a simple consumer's, which the broker takes while the group has no
                # members (earlier kmq consumers joined it; see "Upgrading" in the README).
                group_id=f"{self.group_id}.retry",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                request_timeout_ms=cfg.request_timeout_ms,
                # Copies are written in transactions. On the embedded broker a copy waited
                # for about this long after its commit (the fetch waiting at the broker is
                # not answered at once): 500 ms here put 160-180 ms into the redelivery
                # delay's median, 100 ms about 85 (bench/results/retry-wait-*.md).
                fetch_max_wait_ms=100,
                isolation_level="read_committed",  # a transactional tracker's aborted copies
            )
            self._refresh_layout(initial=True)
            self._kc.subscribe([self._topic], listener=self._given_up)
            self._txn: KafkaProducer | None = None
            self._txn_id = f"{self.group_id}-{uuid.uuid4().hex[:12]}"
            if config.transactional:
                self._txn = self._transactional_producer()
                self._txn.init_transactions()
        except (KafkaError, BrokerError) as exc:
            self._writer.close(1.0)
            raise BrokerError(f"cannot start consumer for queue {queue.id!r}: {exc}") from exc
        self._thread = threading.Thread(
            target=self._run, name=f"kmq-consumer-{queue.id}", daemon=True
        )
        self._thread.start()

    def _transactional_producer(self) -> KafkaProducer:
        cfg = self._svc_config
        return kafka_clients.producer(
            cfg.connection,
            "txn",
            transactional_id=self._txn_id,
            transaction_timeout_ms=_TXN_TIMEOUT_MS,
            acks="all",
            enable_idempotence=True,
            max_request_size=cfg.max_message_bytes,
        )

    def _renew_transactions(self) -> None:
        """Build the transactional producer again after a failed START transaction dropped
        it, under the same transactional id: the new one fences the old and ends whatever
        transaction it left open. kafka-python's producer is unusable for good after some
        failures (fenced, its epoch bumped by the broker's transaction timeout): kept, it
        failed every later batch, and the consumer delivered nothing more."""
        txn = None
        try:
            txn = self._transactional_producer()
            txn_wait.init(txn, _TXN_TIMEOUT_MS / 1000)
        except (KafkaError, BrokerError) as exc:
            if txn is not None:
                with contextlib.suppress(Exception):
                    kafka_clients.close_producer(txn, 0)
            raise _StartFailed(f"transactional producer not renewed: {exc!r}") from exc
        self._txn = txn
        log.info("queue %r: transactional producer renewed", self.queue)

    def _queue_group_member(self) -> KafkaConsumer:
        cfg = self._svc_config
        declared = self._declaration
        made: list[KafkaConsumer] = []
        if self.config.rebalance == EAGER:
            strategy: list[Any] = [LayoutAssignor(declared), RangePartitionAssignor]
        else:  # the member tells the leader what it reads, to keep it through a rebalance
            strategy = [
                LayoutAssignor(
                    declared,
                    lambda: made[0].assignment() if made else (),
                    spares=self._spare_state,
                    on_spares=self._on_spares,
                )
            ]
        client = kafka_clients.consumer(  # installs kmq.join_fix: a group member
            cfg.connection,
            "consumer",
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=max(100, cfg.session_timeout_ms // 4),
            request_timeout_ms=max(cfg.request_timeout_ms, cfg.session_timeout_ms + 5000),
            fetch_max_wait_ms=100,
            isolation_level="read_committed",  # a transactional tracker's aborted copies
            partition_assignment_strategy=strategy,
        )
        made.append(client)
        return client

    @staticmethod
    def _poll_ms(client: KafkaConsumer, wanted_ms: int) -> int:
        """A poll timeout long enough for a group (re)join to finish inside it. kafka-python
        3.0.12 drops a join that completes between two polls and starts it over;
        :mod:`kmq.join_fix` repairs that on 3.0.12, and this keeps other versions joining."""
        if client.group_metadata().state != MemberState.STABLE:
            return max(wanted_ms, _JOIN_POLL_MS)
        return wanted_ms

    def _client(self, tp: TopicPartition) -> KafkaConsumer:
        """The Kafka consumer that reads ``tp``."""
        return self._rc if tp.topic == self._retry_topic else self._kc

    # -- application side -------------------------------------------------------------

    def receive(self, timeout_s: float | None = 1.0) -> Message | None:
        """The next message, or ``None`` if none arrives within ``timeout_s``.

        ``timeout_s=0`` never blocks; ``None`` waits indefinitely. Raises
        :class:`kmq.ConsumerClosedError` once the consumer is closed or its loop failed.
        """
        got = self._take(1, timeout_s)
        return got[0] if got else None

    def receive_many(self, max_messages: int = 100, timeout_s: float | None = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages: waits up to ``timeout_s`` for the first one, then
        returns whatever else is already buffered (an empty list if nothing came)."""
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise InvalidArgumentError(
                f"max_messages must be an integer >= 1, got {max_messages!r}"
            )
        return self._take(max_messages, timeout_s)

    def _take(self, count: int, timeout_s: float | None) -> list[Message]:
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0
        ):
            raise InvalidArgumentError(f"timeout_s must be >= 0 or None, got {timeout_s!r}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise ConsumerClosedError(f"consumer of queue {self.queue!r} is closed")
                retry, ready = self._ready_retry, self._ready
                # Asked each time, not cached: once the control topic shows a pause, nothing
                # more is handed out, even before the poll thread notices it.
                if (retry or ready) and not (
                    self._paused or self._pauses.paused_until_ms(self.queue)
                ):
                    out: list[Message] = []
                    held = State.HELD
                    while retry and len(out) < count:
                        message = retry.popleft()
                        message._state = held
                        out.append(message)
                    while ready and len(out) < count:
                        message = ready.popleft()
                        message._state = held
                        out.append(message)
                    if self._at_most_once:  # its room is the buffer's
                        self._freed()
                    if self._metrics is not None:
                        self._metrics.taken(out)
                    return out
                if self._error is not None:
                    raise ConsumerClosedError(
                        f"consumer of queue {self.queue!r} failed: {self._error!r}"
                    ) from self._error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
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
            return self._buffered() if self._at_most_once else len(self._leases)

    @property
    def ready(self) -> int:
        """Messages :meth:`receive` would return at once: STARTed, committed, not yet taken."""
        with self._cond:
            return self._buffered()

    def _buffered(self) -> int:
        return len(self._ready) + len(self._ready_retry)

    @property
    def partitions_given_up(self) -> int:
        """Queue-topic partitions this consumer has given up (revoked or lost) since it
        started, at rebalances and when it closes. With cooperative rebalancing a rebalance
        gives up only what moves to another member; eager gives up every partition."""
        return self._given_up.count

    def assignment(self) -> frozenset[int]:
        """Queue-topic partitions this consumer owned at its last poll (empty before it joins)."""
        return self._assigned

    def retry_assignment(self) -> frozenset[int]:
        """Retry-topic partitions this consumer reads now: those that go with its queue-topic
        partitions (empty before it joins its group)."""
        return frozenset(tp.partition for tp in self._rc.assignment())

    def fetching(self) -> frozenset[int]:
        """The assigned partitions it still reads: all but those it has finished (other
        queues' partitions, read up to where records of the old layout end)."""
        return frozenset(p for p in self._assigned if p not in self._legacy_done)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every marker written so far is on the broker: acks and nacks made
        with ``wait=False`` included. Raises :class:`kmq.BrokerError` if some could not be
        written (their messages are redelivered when their leases run out)."""
        if not self._writer.sync(timeout_s):
            raise BrokerError(f"markers of queue {self.queue!r} not all written in {timeout_s:g} s")

    def ack_many(self, messages: Iterable[Message], *, wait: bool = True) -> None:
        """Ack several messages at once: one broker round trip for all of their END markers.
        Raises :class:`kmq.MessageStateError` before writing anything if one of them is not
        held (settled already, or another consumer's)."""
        batch = list(messages)
        with self._cond:
            for message in batch:
                if message._consumer is not self:
                    raise MessageStateError(f"{message!r} was not received by this consumer")
                if message._state is not State.HELD:
                    raise MessageStateError(f"cannot ack {message!r}: already settled")
            if self._metrics is not None:
                for message in batch:
                    self._metrics.settled(message, State.ACKED)
            if self._at_most_once:
                for message in batch:
                    message._state = State.ACKED
                return
            items: list[tuple[Entry, int]] = []
            for message in batch:
                self._leases.settle(message.key)
                message._state = State.ACKED
                items.append((self._entry(_END, message, 0), message.marker_partition))
            self._freed()
            flush = self._writer.add_many(items) if items else None
        if flush is not None and wait:
            self._writer.flush_soon()
            partitions = {m.marker_partition for m in batch}
            self._await(flush, partitions, f"ack of {len(batch)} messages")

    def hand_off(self, message: Message, lease_s: float) -> Receipt:
        """Hand a held message over to someone else (an HTTP client of a proxy, say) for
        ``lease_s`` seconds: this consumer stops keeping it alive and forgets it, and from
        then on it is settled with a :class:`kmq.Settler` and the returned receipt, from any
        process. Unsettled (nor extended) after ``lease_s``, it is redelivered. Returns once
        the broker holds the new lease."""
        return self.hand_off_many([message], lease_s)[0]

    def hand_off_many(self, messages: Sequence[Message], lease_s: float) -> list[Receipt]:
        """:meth:`hand_off` for several messages, in one broker round trip. Checks them all
        before handing any over."""
        if self._at_most_once:
            raise MessageStateError("at-most-once messages have no lease to hand off")
        ms = _lease(lease_s)
        batch = list(messages)
        with self._cond:
            for message in batch:
                if message._consumer is not self:
                    raise MessageStateError(f"{message!r} was not received by this consumer")
                if message._state is not State.HELD:
                    raise MessageStateError(f"cannot hand off {message!r}: already settled")
            items: list[tuple[Entry, int]] = []
            for message in batch:
                self._leases.settle(message.key)
                message._state = State.HANDED_OFF
                items.append((self._entry(_KEEPALIVE, message, ms), message.marker_partition))
            self._freed()
            flush = self._writer.add_many(items) if items else None
        if flush is not None:
            self._writer.flush_soon()
            self._await(flush, {m.marker_partition for m in batch},
                        f"hand-off of {len(batch)} messages")  # fmt: skip
        return [
            Receipt(m.queue, m.id, m.lane, m.partition, m.offset, m.attempt, m.marker_partition)
            for m in batch
        ]

    def close(self, timeout_s: float = 30.0) -> None:
        """Release every unsettled message for immediate redelivery and leave the group."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._stop.set()
        self._thread.join()
        try:
            with self._cond:
                for message in self._leases.take_all():
                    if message._state is State.HELD:
                        text = b"released: consumer closed"
                        entry = self._entry(_NACK, message, 0, text)
                    else:
                        text = b"released unseen: consumer closed"
                        entry = self._entry(_RELEASE, message, 0, text)
                    self._writer.add(entry, message.marker_partition, text)
                    message._state = State.RELEASED
                for message in (*self._ready, *self._ready_retry):
                    message._state = State.RELEASED
                self._ready.clear()
                self._ready_retry.clear()
            if not self._writer.close(timeout_s):
                log.error(
                    "queue %r: markers written at close did not all reach the broker; "
                    "their messages are redelivered when their leases run out",
                    self.queue,
                )
        finally:
            self._kc.close(autocommit=False)
            self._rc.close(autocommit=False)
            if self._txn is not None:
                kafka_clients.close_producer(self._txn, timeout_s)

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
        flush: Flush | None = None
        with self._cond:
            if message._state is not State.HELD:
                raise MessageStateError(f"cannot {verb} {message!r}: already settled")
            if self._metrics is not None:
                self._metrics.settled(message, state)
            if self._at_most_once:
                if state is not State.ACKED:
                    raise MessageStateError(
                        f"cannot {verb} {message!r}: at-most-once messages are never redelivered"
                    )
                message._state = state
                return
            self._leases.settle(message.key)
            self._freed()
            message._state = state
            if state is State.ACKED:
                flush = self._writer.add(self._entry(_END, message, 0), message.marker_partition)
            elif state is State.NACKED:
                if delay_ms is None:
                    delay_ms = round(
                        1000 * self._policy.backoff_s(message.attempt, self.config.rng)
                    )
                text = reason.encode()
                entry = self._entry(_NACK, message, delay_ms, text)
                flush = self._writer.add(entry, message.marker_partition, text)
        if state is State.REJECTED:
            flush = self._dead_letter(message, reason)
        if flush is not None and wait:
            self._writer.flush_soon()
            self._await(flush, {message.marker_partition}, f"{verb} of {message.id}")

    def _await(self, flush: Flush, partitions: set[int], what: str) -> None:
        if not flush.wait(self._request_timeout_s):
            raise BrokerError(
                f"{what} not acknowledged by the broker in {self._request_timeout_s:g} s; "
                "unwritten markers only cost redeliveries when leases run out"
            )
        for partition in partitions:
            exc = flush.error(partition)
            if exc is not None:
                raise BrokerError(
                    f"{what} not written ({exc!r}); the message will be redelivered when its "
                    "lease runs out"
                ) from exc

    # -- background loop --------------------------------------------------------------

    def _run(self) -> None:
        backoff_s = 0.1
        try:
            while not self._stop.is_set():
                try:
                    self._tick()
                    room = 0 if self._paused else self._room()
                    self._apply_backpressure(room)
                    busy = bool(self._starting or self._committing)
                    self._progress.clear()
                    # The retry lane first (at most every few ms: each poll costs the Kafka
                    # client some work): never blocks, paused only when full.
                    now = time.monotonic()
                    if now >= self._next_retry_poll and self._retry_reading:
                        copies = self._whole(self._rc.poll(timeout_ms=0, max_records=max(1, room)))
                        if copies:
                            self._retry_poll_s = _RETRY_POLL_S
                            self._begin(copies)
                            continue
                        self._retry_poll_s = min(2 * self._retry_poll_s, _RETRY_POLL_MAX_S)
                        self._next_retry_poll = now + self._retry_poll_s
                    if room <= self._reserve and not busy:
                        # The queue topic is paused: wait for the application to settle
                        # something, not in poll(). (The zero-timeout polls keep the group
                        # membership alive meanwhile.)
                        held = self._kc.poll(timeout_ms=self._poll_ms(self._kc, 0), max_records=1)
                        if held:
                            self._unread(held)
                        self._wait_for_room(self._reserve, self.config.poll_timeout_ms / 1000)
                        continue
                    if self._starting:
                        # One batch at a time between its STARTs and their acknowledgement
                        # (the previous one's offset commit may be in flight meanwhile):
                        # records pile up in the fetch buffer, so the next poll takes more
                        # of them at once, and a message costs a smaller share of a
                        # batch's START records, offset commit and polls.
                        self._advance()
                        if self._starting:
                            self._progress.wait(self.config.poll_timeout_ms / 1000)
                        continue
                    records = self._whole(
                        self._kc.poll(
                            timeout_ms=self._poll_ms(
                                self._kc, 0 if busy else self.config.poll_timeout_ms
                            ),
                            max_records=max(1, min(room - self._reserve, self._batch_max)),
                        )
                    )
                    if records:
                        self._begin(records)
                    self._advance()
                    if busy and not records:
                        # Batches are between START and hand-out and nothing new has come:
                        # sleep until one moves on (a flush or commit is over), not in
                        # poll() loops, each of which costs Kafka client work.
                        self._progress.wait(self.config.poll_timeout_ms / 1000)
                    backoff_s = 0.1
                except (KafkaError, _StartFailed) as exc:
                    log.warning("queue %r: %r; retrying in %.1f s", self.queue, exc, backoff_s)
                    self._stop.wait(backoff_s)
                    backoff_s = min(backoff_s * 2, 5.0)
            self._drain()
        except BaseException as exc:  # surfaced to the application by receive()
            log.exception("queue %r: consumer loop failed", self.queue)
            self._error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def _drain(self) -> None:
        """On close: let batches already polled finish their cycle (bounded), so their
        offsets are committed and a new owner does not read them again."""
        deadline = time.monotonic() + self._request_timeout_s
        while (self._starting or self._committing) and time.monotonic() < deadline:
            try:
                self._progress.clear()
                self._advance()
            except (KafkaError, _StartFailed):
                break
            self._progress.wait(0.05)

    def _tick(self) -> None:
        now = time.monotonic()
        if now < self._next_tick:
            return
        self._next_tick = now + min(0.05, self._keepalive_s / 4)
        with self._cond:
            due = self._leases.due(now)
            if due:
                if self._metrics is not None:
                    self._metrics.keepalives.inc(len(due))
                self._writer.add_many(
                    [(self._entry(_KEEPALIVE, m, self._lease_ms), m.marker_partition) for m in due]
                )
        paused = bool(self._pauses.paused_until_ms(self.queue))
        if paused != self._paused:
            log.info("queue %r %s", self.queue, "paused" if paused else "resumed")
            with self._cond:
                self._paused = paused
                self._cond.notify_all()
        if now >= self._next_layout_check:
            self._next_layout_check = now + _LAYOUT_CHECK_S
            self._refresh_layout()
            self._check_legacy()
        self._announce(now)

    def _announce(self, now: float) -> None:
        """Every ``_ANNOUNCE_S``, say what this consumer reads of the retry lane on each
        markers partition it has written nothing to meanwhile: every tracker hears only its
        own partitions, and a consumer that holds nothing writes no markers otherwise. So a
        tracker that hears no reader of a queue knows that none is there, rather than that
        the readers are idle: an idle owner passed over meant a copy left on a killed
        spare reader's partition, which no group member reads, was never copied toward it."""
        if self._at_most_once or not self._retry_reading or now < self._next_announce:
            return  # at-most-once writes no markers at all
        self._next_announce = now + _ANNOUNCE_S
        quiet = self._writer.quiet_partitions(now - _ANNOUNCE_S)
        if quiet:
            self._writer.add_many([(_HERE, partition) for partition in quiet])
            self._writer.flush_soon()

    def _wait_for_room(self, above: int, timeout_s: float) -> None:
        with self._room_freed:
            if (not self._paused and self._room() > above) or self._stop.is_set():
                return
            self._starved = True
            self._room_freed.wait(timeout_s)
            self._starved = False

    def _freed(self) -> None:
        """Called under the lock whenever a message is settled."""
        if self._starved:
            self._starved = False
            self._room_freed.notify()

    def _room(self) -> int:
        with self._cond:
            unsettled = self._buffered() if self._at_most_once else len(self._leases)
            return self.config.max_in_flight - unsettled

    def _apply_backpressure(self, room: int) -> None:
        """The retry lane is paused only when full, the queue topic already when only the
        reserve for the retry lane is left. A consumer's partitions are paused all at once
        (kafka-python 3.0.12 can stop fetching a partition that was paused while others
        kept fetching), except those finished with for good."""
        assigned = self._kc.assignment()
        self._assigned = frozenset(tp.partition for tp in assigned)
        self._follow_queue_partitions()
        self._continuity.keep_only(assigned | self._rc.assignment())
        if room <= self._reserve:
            want = set(assigned)
        else:
            want = {tp for tp in assigned if tp.partition in self._legacy_done}
        self._set_paused(self._kc, want)
        if self._retry_reading:
            self._set_paused(self._rc, set(self._rc.assignment()) if room <= 0 else set())

    def _spare_state(self) -> tuple[frozenset[int], frozenset[int]]:
        """For the assignor, at each join: the queue's spare candidates, and the spares this
        consumer reads or is about to (given at the last join, perhaps not yet assigned to
        its retry-lane reader): the leader keeps those with it, never giving them to another
        member meanwhile."""
        candidates = self._spare_candidates
        return candidates, self._spares_reading | (self._spares & candidates)

    def _on_spares(self, spares: frozenset[int]) -> None:
        """The spares its group's leader gives it (:func:`kmq.assignor.assign_spares`);
        called on the loop's thread, at the end of a join."""
        self._spares = spares

    def _follow_queue_partitions(self) -> None:
        """Read the retry-topic partitions that go with the queue partitions this consumer
        owns now (:func:`kmq.layout.retry_reads`), by ``assign()``: the retry lane has no
        group of its own to rebalance, so it keeps being read while the queue's group
        rebalances, and a killed holder's copies, which the tracker sends to the retry
        partition of another queue partition, reach a live consumer at once. Plus the
        spares its group's leader gave it (:func:`kmq.layout.spare_candidates`): a member
        that owns none of the queue's partitions then still takes copies, even when every
        owner was killed at once."""
        spares = self._spares & self._spare_candidates
        self._spares_reading = spares
        want = (
            retry_reads(self._queue_window, self._retry_window, self._retry_read, self._assigned)
            | spares
        )
        want |= self._adopt(want)
        if want == self._retry_reading:
            return
        self._retry_reading = frozenset(want)
        self._reads = [(READS_HEADER, encode_reads(self.queue, want))] if want else []
        # assign() keeps the position of a partition it keeps; an empty one unsubscribes.
        self._rc.assign([TP(self._retry_topic, p) for p in sorted(want)])
        self._retry_poll_s = _RETRY_POLL_S
        self._next_retry_poll = 0.0

    def _adopt(self, reading: Set[int]) -> frozenset[int]:
        """The retry partitions this consumer reads besides ``reading`` because a tracker
        said nobody reads them (:mod:`kmq.adopted`)."""
        version = self._pauses.version
        if version != self._notices_version:
            self._notices_version = version
            self._noticed = self._pauses.table.unread(self._retry_topic, self.queue)
        if not self._noticed and not self._adopted.partitions:
            return frozenset()
        meta = self._kc.group_metadata()
        new, gone = self._adopted.update(
            self._noticed,
            reading,
            meta.generation_id,
            meta.state == MemberState.STABLE,
            time.monotonic(),
            read_through=self._read_through(self._adopted.partitions),
        )
        if new:
            log.info(
                "queue %r: a tracker says nobody reads its retry partitions %s; reading them "
                "until this consumer's group settles",
                self.queue,
                sorted(new),
            )
        if gone:
            log.info("queue %r: no longer reading adopted retry partitions %s",
                     self.queue, sorted(gone))  # fmt: skip
        return self._adopted.partitions

    def _read_through(self, partitions: Set[int]) -> frozenset[int]:
        """Those of ``partitions`` (of the retry topic) whose position has reached the high
        watermark of their last fetch. ``position(timeout_ms=0)`` never waits (it sends
        nothing once every assigned partition has a position) and is None before this one
        has; the position passes transaction markers, so a partition read to its end is at
        its high watermark."""
        out = set()
        for partition in partitions:
            tp = TP(self._retry_topic, partition)
            highwater = self._rc.highwater(tp)
            if highwater is None:
                continue  # not fetched yet
            try:
                position = self._rc.position(tp, timeout_ms=0)
            except KafkaError:  # not assigned yet, or an offset lookup failing
                continue
            if position is not None and position >= highwater:
                out.add(partition)
        return frozenset(out)

    @staticmethod
    def _set_paused(client: KafkaConsumer, want: set[TopicPartition]) -> None:
        paused = client.paused()
        pause, resume = want - paused, paused - want
        if pause:
            client.pause(*pause)
        if resume:
            client.resume(*resume)

    # -- layout ---------------------------------------------------------------------------

    def _declaration(self) -> dict[str, list[int]]:
        """What this member asks its group's leader for (see kmq.assignor)."""
        return {self._topic: sorted(self._declared)}

    def _refresh_layout(self, *, initial: bool = False) -> None:
        """Follow the queue's layout: rejoin the group when it gains partitions."""
        version = self._pauses.version
        if not initial and version == self._layout_version:
            return
        self._layout_version = version
        read = self._svc.read_partitions(self.queue)
        declared = {p for p, stop in read.items() if stop is None}
        legacy = {p: stop for p, stop in read.items() if stop is not None}
        for partition, stop in legacy.items():
            if partition in self._legacy_done:
                continue
            try:
                committed = self._kc.committed(
                    TopicPartition(self._topic, partition), timeout_ms=self._lookup_timeout_ms()
                )
            except KafkaError as exc:  # read it, as if not done: the next change looks again
                log.debug("queue %r: committed offset of partition %d unknown (%r)",
                          self.queue, partition, exc)  # fmt: skip
                committed = None
            if committed is not None and committed >= stop:
                self._legacy_done.add(partition)
            else:
                declared.add(partition)
        self._retry_read = frozenset(self._svc.read_partitions(self.queue, self._retry_topic))
        self._spare_candidates = frozenset(
            spare_candidates(self._svc.partition_count(self._retry_topic), self._retry_read)
        )
        self._queue_window = self._svc.write_partitions(self.queue)
        self._retry_window = self._svc.write_partitions(self.queue, self._retry_topic)
        self._read = read
        grew = not set(declared) <= self._declared
        self._declared = frozenset(declared)
        if initial:
            return
        if grew:
            log.info("queue %r now reads partitions %s: rejoining its group",
                     self.queue, sorted(declared))  # fmt: skip
            self._kc.unsubscribe()
            self._kc.subscribe([self._topic], listener=self._given_up)

    def _check_legacy(self) -> None:
        for tp in self._kc.assignment():
            if tp.partition in self._legacy_done:
                continue
            if tp.partition not in self._read:
                # Assigned before the layout said otherwise (an upgrade finished meanwhile):
                # it holds none of this queue's records, so stop fetching it.
                self._legacy_done.add(tp.partition)
                continue
            stop = self._read[tp.partition]
            if stop is None:
                continue
            with contextlib.suppress(KafkaError):
                position = self._kc.position(tp, timeout_ms=0)
                # None: not known yet (just assigned, its committed offset still being read).
                if position is not None and position >= stop:
                    log.info("queue %r: read partition %d up to its old-layout end %d",
                             self.queue, tp.partition, stop)  # fmt: skip
                    self._legacy_done.add(tp.partition)

    # -- the batch cycle ------------------------------------------------------------------

    def _begin(self, records: dict[TopicPartition, list[Any]]) -> None:
        messages: list[Message] = []
        firsts: dict[TopicPartition, int] = {}
        commits: dict[TopicPartition, int] = {}
        key = self._key
        for tp, batch in records.items():
            if not batch:
                continue
            firsts[tp] = batch[0].offset
            commits[tp] = batch[-1].offset + 1
            lane = self._lanes.get(tp.topic, QUEUE_LANE)
            for record in batch:
                if record.key == key:
                    messages.append(self._message(record, lane))
        if self._at_most_once:
            self._begin_at_most_once(commits, firsts, messages)
            return
        if self.config.transactional:
            self._begin_transaction(commits, firsts, messages)
            return
        batch_ = Batch(messages, firsts, commits)
        self._cycle.add(batch_)
        if not messages:  # nothing of ours: only the offsets move, in order
            self._apply(self._cycle.started(batch_, True))
            return
        now = time.monotonic()
        lease_ms = self._lease_ms
        max_attempts = self._policy.max_attempts
        text = self._dlq_text
        with self._cond:
            self._leases.started([(m.key, m) for m in messages], now)
            # One add_many: every START of the batch goes out in the flush it waits for.
            flush = self._writer.add_many(
                [
                    (
                        (
                            _START,
                            m.lane,
                            m.partition,
                            m.offset,
                            m.attempt,
                            lease_ms,
                            max_attempts,
                            len(text),
                        ),
                        m.marker_partition,
                    )
                    for m in messages
                ],
                text,
            )
        self._writer.flush_soon()
        self._starting.append((batch_, flush, frozenset(m.marker_partition for m in messages)))

    def _advance(self) -> None:
        """Move batches on: START written -> commit sent -> commit over -> handed out."""
        if self._starting:
            still: list[tuple[CycleBatch, Flush, frozenset[int]]] = []
            failed: BaseException | None = None
            for batch, flush, partitions in self._starting:
                if not flush.done:
                    still.append((batch, flush, partitions))
                    continue
                errors = [flush.errors[p] for p in partitions if p in flush.errors]
                if errors:
                    failed = failed or errors[0]
                self._apply(self._cycle.started(batch, not errors))
            live = set(map(id, self._cycle.batches()))
            self._starting = [s for s in still if id(s[0]) in live]
            if failed is not None:
                raise _StartFailed(f"START markers not acknowledged: {failed!r}")
        if self._committing:
            still_c: list[tuple[CycleBatch, Any]] = []
            for batch, future in self._committing:
                if future is None or not future.is_done:
                    still_c.append((batch, future))
                    continue
                if future.failed() and batch.messages:
                    log.warning(
                        "queue %r: offset commit failed (%r); these %d messages may also be "
                        "delivered to the partition's next owner",
                        self.queue, future.exception, len(batch.messages),
                    )  # fmt: skip
                self._apply(self._cycle.committed(batch))
            self._committing = still_c
            self._send_commits()

    def _apply(self, actions: Actions[TopicPartition, Message]) -> None:
        if actions.commit:
            self._committing.extend((batch, None) for batch in actions.commit)
            self._send_commits()
        if actions.dropped:
            with self._cond:
                for message in actions.dropped:
                    self._leases.settle(message.key)
        self._seek(actions.seek)
        if actions.hand_out and not self._stop.is_set():
            self._hand_out(actions.hand_out)

    def _send_commits(self) -> None:
        """Commit the offsets of the batches waiting for it, one commit per Kafka consumer
        at a time: those that came while one was in flight go together in the next, the
        later batch's offset winning, so the order of commits is the order of polls.
        (One commit per batch piled up behind a stalled coordinator, and kafka-python
        refuses a sixth request in flight on a connection: the commit failed.)"""
        busy: set[int] = set()
        waiting: dict[int, tuple[KafkaConsumer, list[int]]] = {}
        for i, (batch, future) in enumerate(self._committing):
            client = self._client(next(iter(batch.commits)))
            if future is not None:
                if not future.is_done:
                    busy.add(id(client))
                continue
            waiting.setdefault(id(client), (client, []))[1].append(i)
        for key, (client, indexes) in waiting.items():
            if key in busy:
                continue
            merged: dict[TopicPartition, int] = {}
            for i in indexes:
                merged.update(self._committing[i][0].commits)
            offsets = {tp: OffsetAndMetadata(o, "", -1) for tp, o in merged.items()}
            try:
                future = client.commit_async(offsets)
            except KafkaError as exc:
                from kafka.future import Future

                future = Future().failure(exc)
            future.add_both(self._commit_over)
            for i in indexes:
                self._committing[i] = (self._committing[i][0], future)

    def _commit_over(self, _: object) -> None:
        self._progress.set()

    def _hand_out(self, messages: list[Message]) -> None:
        with self._cond:
            for message in messages:
                (self._ready_retry if message.lane else self._ready).append(message)
            self._cond.notify_all()

    def _begin_transaction(
        self,
        commits: dict[TopicPartition, int],
        firsts: dict[TopicPartition, int],
        messages: list[Message],
    ) -> None:
        """STARTs and the offset commit in one transaction, then hand out."""
        offsets = {tp: OffsetAndMetadata(o, "", -1) for tp, o in commits.items()}
        if self._txn is None:
            try:
                self._renew_transactions()
            except _StartFailed:
                self._seek(firsts)
                raise
        txn = self._txn
        assert txn is not None
        wait_s = _TXN_TIMEOUT_MS / 1000
        try:
            txn.begin_transaction()
            by_partition: dict[int, list[Entry]] = {}
            for m in messages:
                by_partition.setdefault(m.marker_partition, []).append(
                    (
                        _START,
                        m.lane,
                        m.partition,
                        m.offset,
                        m.attempt,
                        self._lease_ms,
                        self._policy.max_attempts,
                        len(self._dlq_text),
                    )
                )
            for partition, entries in by_partition.items():
                texts = [self._dlq_text] * len(entries) if self._dlq_text else []
                txn.send(
                    self._svc_config.marker_topic,
                    value=encode_entries(entries, texts),
                    partition=partition,
                )
            group = self._client(next(iter(offsets))).group_metadata()
            txn_wait.send_offsets(txn, offsets, group, wait_s)
            with self._cond:
                self._leases.started([(m.key, m) for m in messages], time.monotonic())
            txn_wait.commit(txn, wait_s)
        except KafkaError as exc:
            with contextlib.suppress(KafkaError):
                txn_wait.abort(txn, wait_s)
            # Whatever failed, the next batch goes through a new producer (_renew_transactions).
            self._txn = None
            with contextlib.suppress(Exception):
                kafka_clients.close_producer(txn, 0)
            with self._cond:
                for m in messages:
                    self._leases.settle(m.key)
            self._seek(firsts)
            raise _StartFailed(f"START transaction failed: {exc!r}") from exc
        self._hand_out(messages)

    def _begin_at_most_once(
        self,
        commits: dict[TopicPartition, int],
        firsts: dict[TopicPartition, int],
        messages: list[Message],
    ) -> None:
        """Commit first, then hand out: never delivered twice, lost if we crash holding it."""
        offsets = {tp: OffsetAndMetadata(o, "", -1) for tp, o in commits.items()}
        try:
            self._client(next(iter(offsets))).commit(offsets)
        except KafkaError as exc:
            messages = self._committed_anyway(offsets, firsts, messages, exc)
            if not messages:
                raise _StartFailed(f"offset commit failed: {exc!r}") from exc
        self._hand_out(messages)

    def _unread(self, records: dict[TopicPartition, list[Any]]) -> None:
        """Give back records a poll returned while the queue topic was meant to be paused.

        A partition assigned during that very poll is not paused yet, so the poll can
        return its first record. Dropping it would move the position past a record no one
        started, and the next batch's commit would skip it for good: most likely how a chaos
        run lost a message that no worker ever started, and how a paused queue's test missed
        its only message."""
        firsts: dict[TopicPartition, int] = {}
        for tp, batch in records.items():
            if batch:
                if self._continuity.expected(tp) is None:
                    self._baseline(tp)
                again = self._continuity.read(tp, batch[0].offset, batch[-1].offset)
                firsts[tp] = batch[0].offset if again is None else again
        self._seek(firsts)

    def _whole(self, records: dict[TopicPartition, list[Any]]) -> dict[TopicPartition, list[Any]]:
        """``records`` up to the first record a poll may have skipped records before (see
        :mod:`kmq.continuity`), whether between polls or inside one: from there on each
        partition is sought back to be read again."""
        if not records:
            return records
        continuity = self._continuity
        recovered = continuity.recovered
        for tp, batch in list(records.items()):
            if not batch:
                continue
            if continuity.expected(tp) is None:
                self._baseline(tp)
            # The tracker writes copies in transactions: a marker follows each of them, and
            # reading every such gap again would delay the next copy by a fetch.
            holes = 1 if tp.topic == self._retry_topic else 0
            first, last = batch[0].offset, batch[-1].offset
            if last - first + 1 == len(batch):  # the usual case: no offset missing
                again = continuity.read(tp, first, last, holes)
                keep = 0 if again is not None else len(batch)
            else:
                keep, again = continuity.read_batch(tp, [r.offset for r in batch], holes)
            if again is not None:
                log.debug("queue %r: %s skipped from offset %d; reading it again",
                          self.queue, tp, again)  # fmt: skip
                if keep:
                    records[tp] = batch[:keep]
                else:
                    del records[tp]
                self._seek({tp: again})
        if continuity.recovered != recovered:
            log.warning(
                "queue %r: a poll skipped records that reading again returned (%d times so "
                "far); nothing was lost",
                self.queue, continuity.recovered,
            )  # fmt: skip
        return records

    def _baseline(self, tp: TopicPartition) -> None:
        """Where the first poll of a partition newly assigned should start: its committed
        offset, or with none the start of its log. Without it the gap check trusts that poll,
        and a poll can skip records at its start (see :mod:`kmq.continuity`); most likely how a
        test with two proxy replicas writing to one partition at once lost three records near
        its head. If it cannot be told, that poll goes unchecked as before."""
        client = self._client(tp)
        timeout_ms = self._lookup_timeout_ms()
        try:
            start = client.committed(tp, timeout_ms=timeout_ms)
            if start is None:
                start = client.beginning_offsets([tp], timeout_ms=timeout_ms).get(tp)
        except KafkaError as exc:
            log.debug("queue %r: where %s starts is unknown (%r)", self.queue, tp, exc)
            return
        if start is not None:
            self._continuity.moved(tp, start)

    def _lookup_timeout_ms(self) -> int:
        """How long a lookup on the loop thread may wait: half a keep-alive interval at
        most, since this thread writes the keep-alives."""
        return max(100, int(min(self._request_timeout_s, self._keepalive_s / 2) * 1000))

    def _seek(self, firsts: Mapping[TopicPartition, int]) -> None:
        for tp, offset in firsts.items():
            # A partition revoked meanwhile raises here; its new owner reads it anyway.
            with contextlib.suppress(Exception):
                self._client(tp).seek(tp, offset)
                self._continuity.moved(tp, offset)

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
        nothing. If even that cannot be told, the partition's messages are dropped, never
        doubled.
        """
        landed: set[int] = set()
        for tp, meta in commits.items():
            client = self._client(tp)
            try:
                committed = client.committed(tp)
            except KafkaError as err:
                log.error(
                    "queue %r: offset commit failed (%r) and the committed offset of %s is "
                    "unknown (%r): its messages are dropped (at-most-once)",
                    self.queue, exc, tp, err,
                )  # fmt: skip
                continue
            if committed == meta.offset and tp in client.assignment():
                # Ours, and committed exactly up to this batch (further on would mean a new
                # owner has read and committed it already).
                landed.add(tp.partition)
                continue
            self._seek({tp: committed if committed is not None else firsts[tp]})
        return [m for m in messages if m.partition in landed]

    # -- messages and markers -------------------------------------------------------------

    def _message(self, record: Any, lane: int) -> Message:
        partition, offset = record.partition, record.offset
        headers = record.headers
        user: tuple[tuple[str, bytes], ...]
        if len(headers) == 1 and headers[0][0] == ID_HEADER and headers[0][1]:
            message_id, attempt, user = headers[0][1].decode("utf-8", "replace"), 1, ()
        else:  # copies (an attempt header), user headers, foreign records
            found, attempt, user = parse_queue_headers(headers)
            message_id = found or f"ext-{partition}-{offset}"
        return Message._make(
            self,
            record.value or b"",
            message_id,
            self.queue,
            attempt,
            user,
            partition,
            offset,
            record.timestamp,
            lane,
            delivery_key(lane, partition, offset),
            crc32(message_id.encode()) % self._marker_partitions,
        )

    def _entry(self, kind: int, message: Message, after_ms: int, text: bytes = b"") -> Entry:
        return (kind, message.lane, message.partition, message.offset, message.attempt,
                after_ms, 0, len(text))  # fmt: skip

    def _dead_letter(self, message: Message, reason: str) -> Flush:
        """Write ``message`` to the dead-letter queue, then its DEAD_LETTERED marker."""
        dlq = self._dead_letter_queue
        partitions = self._svc.write_partitions(dlq)
        try:
            self._producer.send(
                self._topic,
                key=dlq.encode(),
                value=message.payload,
                headers=dead_letter_headers(
                    message.id,
                    self.queue,
                    message.attempt,
                    reason,
                    tuple(message.headers.items()),
                ),
                partition=partitions[message.offset % len(partitions)],
            ).get(timeout=self._request_timeout_s)
        except KafkaError as exc:
            raise BrokerError(
                f"dead letter for {message.id} not written ({exc!r}); the message will be "
                "redelivered when its lease runs out"
            ) from exc
        text = reason.encode()
        entry = self._entry(_DEAD_LETTERED, message, 0, text)
        with self._cond:
            return self._writer.add(entry, message.marker_partition, text)
