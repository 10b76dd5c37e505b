"""The Kafka adapter around :class:`tracker.state.PartitionState`: reads markers through a
consumer group, performs due redeliveries, commits what is safe."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from kmq.control import ControlWatcher
from kmq.layout import write_partitions
from kmq.markers import QUEUE_LANE
from kmq.records import split_key
from tracker.config import TrackerConfig
from tracker.membership import HeartbeatGuard
from tracker.redeliver import Copy, Outcome, Redeliverer, copy_of
from tracker.reread import RecordReader
from tracker.state import Due, PartitionState

log = logging.getLogger("kmq.tracker")

_DEAD_LETTER_HEADROOM_BYTES = 64 * 1024
"""A copy is never larger than the record it comes from, which the SDK kept within
max_message_bytes; a dead letter also carries its origin and last reason as headers. This
only loosens kafka-python's client-side check: the broker's own limit still applies."""


class Tracker:
    """One kmq-tracker replica. :meth:`run` blocks until :meth:`stop` is called."""

    def __init__(self, config: TrackerConfig) -> None:
        self.config = config
        self._states: dict[int, PartitionState] = {}
        self._retired: Counter[str] = Counter()
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._committed: dict[int, int] = {}
        self._fresh: set[int] = set()  # assigned, first batch not read yet
        self._next_commit = 0.0
        self._next_stats = time.monotonic() + config.stats_interval_s
        self._kc = KafkaConsumer(
            bootstrap_servers=config.bootstrap_servers,
            client_id=config.client_id,
            group_id=config.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=max(100, config.session_timeout_ms // 4),
            request_timeout_ms=max(config.request_timeout_ms, config.session_timeout_ms + 5000),
            fetch_max_wait_ms=100,
        )
        self._listener = _Listener()
        self._kc.subscribe([config.marker_topic], listener=self._listener)
        self._txn: KafkaProducer | None = None
        if config.transactional:
            self._txn = KafkaProducer(
                bootstrap_servers=config.bootstrap_servers,
                client_id=f"{config.client_id}-txn",
                transactional_id=f"{config.group_id}-{uuid.uuid4().hex[:12]}",
                acks="all",
                enable_idempotence=True,
                max_request_size=config.max_message_bytes + _DEAD_LETTER_HEADROOM_BYTES,
                request_timeout_ms=config.request_timeout_ms,
            )
            self._txn.init_transactions()
        self._pauses = ControlWatcher(config.bootstrap_servers, config.control_topic)
        self._reader = KafkaConsumer(
            bootstrap_servers=config.bootstrap_servers,
            client_id=f"{config.client_id}-reader",
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # below the log start: read on, and call it gone
            isolation_level="read_committed",
            request_timeout_ms=config.request_timeout_ms,
            fetch_max_wait_ms=50,
        )
        self._producer = KafkaProducer(
            bootstrap_servers=config.bootstrap_servers,
            client_id=f"{config.client_id}-producer",
            acks="all",
            enable_idempotence=True,
            max_request_size=config.max_message_bytes + _DEAD_LETTER_HEADROOM_BYTES,
            request_timeout_ms=config.request_timeout_ms,
        )
        self._topics = {QUEUE_LANE: config.queue_topic}
        self._records = RecordReader(self._reader, self._topics)
        self._redeliverer = Redeliverer(
            self._producer,
            config.queue_topic,
            config.marker_topic,
            self._partitions_of,
            config.request_timeout_ms / 1000,
        )
        self._membership = HeartbeatGuard(self._kc, config.session_timeout_ms)

    # -- control ----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to commit, leave the group and return. Safe from signal handlers."""
        self._stop.set()

    def wait_caught_up(self, timeout_s: float) -> bool:
        """Block until this replica owns partitions and has replayed all of them."""
        return self._caught_up.wait(timeout_s)

    def paused_until_ms(self, queue: str) -> int:
        """When ``queue``'s pause ends (epoch ms) as this replica sees it, or 0."""
        return self._pauses.paused_until_ms(queue)

    def partitions(self) -> list[int]:
        return sorted(self._states)

    def stats(self) -> Counter[str]:
        total = Counter(self._retired)
        for state in list(self._states.values()):
            total.update(state.stats)
        total["in_flight"] = sum(s.in_flight for s in list(self._states.values()))
        return total

    # -- loop -------------------------------------------------------------------------

    def run(self) -> None:
        log.info(
            "started: markers %s, queue %s, group %s",
            self.config.marker_topic,
            self.config.queue_topic,
            self.config.group_id,
        )
        backoff_s = 0.1
        try:
            while not self._stop.is_set():
                try:
                    self._round()
                    backoff_s = 0.1
                except KafkaError as exc:
                    # Broker trouble (a stall, a reset, a rebalance): keep the state, retry.
                    log.warning("%r; retrying in %.1f s", exc, backoff_s)
                    self._stop.wait(backoff_s)
                    backoff_s = min(backoff_s * 2, 5.0)
        finally:
            self._shutdown()

    def _round(self) -> None:
        self._rebalanced()
        records = self._kc.poll(timeout_ms=self.config.poll_timeout_ms, max_records=5000)
        self._rebalanced()
        now = time.monotonic()
        for tp, batch in records.items():
            state = self._states.get(tp.partition)
            if state is None:
                continue
            if tp.partition in self._fresh:
                self._fresh.discard(tp.partition)
                if state.position is not None and batch[0].offset > state.position:
                    # Fetched before a revoke and re-assign: read from the commit point again.
                    self._kc.seek(tp, state.position)
                    continue
            for record in batch:
                state.on_record(record.offset, record.value, now)
        self._sync_offsets()
        self._redeliver()
        self._commit(force=False)
        self._log_stats()

    def _sync_offsets(self) -> None:
        for partition, state in list(self._states.items()):
            tp = TopicPartition(self.config.marker_topic, partition)
            if state.position is None:
                try:
                    state.set_position(self._kc.position(tp))
                except KafkaError as exc:
                    log.warning("partition %d: position unknown yet (%r)", partition, exc)
                    continue
            if state.end_offset is None:
                highwater = self._kc.highwater(tp)
                if highwater is not None:
                    state.set_end_offset(highwater)
        if (
            self._states
            and not self._caught_up.is_set()
            and not any(s.replaying for s in self._states.values())
        ):
            log.info("caught up on partitions %s", self.partitions())
            self._caught_up.set()

    def _redeliver(self) -> None:
        now = time.monotonic()
        if not self._pauses.caught_up.is_set():
            return  # copies go where the queue's layout says: know it first
        if not self._membership.current(now):
            return
        budget = self.config.max_redeliveries_per_round
        due: list[Due] = []
        for state in self._states.values():
            if len(due) >= budget:
                break
            due.extend(state.due(now, budget - len(due)))
        if not due:
            return
        copies: list[Copy] = []
        try:
            result = self._records.read(due)
        except KafkaError as exc:
            log.warning("cannot re-read records to redeliver (%r); retrying", exc)
            for d in due:
                self._failed(d)
            return
        for d in result.gone:
            lane, partition, offset = split_key(d.key)
            log.error(
                "record %s:%d:%d is gone (retention?): it cannot be redelivered",
                self._topics.get(lane, lane), partition, offset,
            )  # fmt: skip
            owner = self._states.get(d.marker_partition)
            if owner is not None:
                owner.discard(d.key, "record_missing")
        if result.waiting:
            log.warning("%d redeliveries wait for the next round: their records were not "
                        "reached in time", len(result.waiting))  # fmt: skip
            for d in result.waiting:
                self._failed(d)
        for d in due:
            record = result.found.get(d.key)
            if record is not None:
                copy = copy_of(d, record)
                if not self._held_by_pause(copy, now):
                    copies.append(copy)
        if not copies:
            return
        if self._txn is not None:
            outcomes = self._redeliver_in_transaction(copies, self._txn)
        else:
            outcomes = self._redeliverer.plainly(copies)
        for outcome in outcomes:
            if outcome.written:
                self._done(outcome.copy)
            else:
                self._failed(outcome.copy.due)

    def _redeliver_in_transaction(self, copies: list[Copy], txn: KafkaProducer) -> list[Outcome]:
        settled: dict[int, list[int]] = {}
        for copy in copies:
            settled.setdefault(copy.due.marker_partition, []).append(copy.due.start_offset)
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for partition, starts in settled.items():
            state = self._states.get(partition)
            offset = state.commit_offset(starts) if state is not None else None
            if offset is not None:
                tp = TopicPartition(self.config.marker_topic, partition)
                offsets[tp] = OffsetAndMetadata(offset, "", -1)
        outcomes = self._redeliverer.in_transaction(
            txn, copies, offsets, self._kc.group_metadata()
        )
        if outcomes and outcomes[0].written:
            for tp, meta in offsets.items():
                self._committed[tp.partition] = meta.offset
        return outcomes

    def _partitions_of(self, queue: str) -> tuple[int, ...]:
        """Where ``queue``'s records go: its layout on the queue topic."""
        topic = self.config.queue_topic
        actual = len(self._reader.partitions_for_topic(topic) or ())
        if not actual:
            raise KafkaError(f"topic {topic} has no partitions")
        return write_partitions(self._pauses.table.layout(topic), queue, actual)

    def _done(self, copy: Copy) -> None:
        if copy.dead_letter_queue:
            log.info(
                "dead-lettered %s (queue %r -> %r after %d attempts, %s)",
                copy.message_id, copy.queue, copy.dead_letter_queue,
                copy.attempt, copy.due.reason,
            )  # fmt: skip
        else:
            log.info(
                "redelivered %s (queue %r, attempt %d, %s)",
                copy.message_id, copy.queue, copy.attempt, copy.due.reason,
            )  # fmt: skip
        owner = self._states.get(copy.due.marker_partition)
        if owner is not None:
            owner.redelivered(copy.due.key, dead_lettered=bool(copy.dead_letter_queue))

    def _held_by_pause(self, copy: Copy, now: float) -> bool:
        """Postpone ``copy`` if its queue is paused; look again within a second."""
        until_ms = self._pauses.paused_until_ms(copy.queue)
        if not until_ms:
            return False
        state = self._states.get(copy.due.marker_partition)
        if state is not None:
            remaining_s = until_ms / 1000 - time.time()
            state.postpone(copy.due.key, now + min(1.0, max(remaining_s, 0.0)))
        return True

    def _failed(self, due: Due) -> None:
        state = self._states.get(due.marker_partition)
        if state is not None:
            state.redelivery_failed(due.key, time.monotonic(), self.config.redelivery_retry_s)

    def _commit(self, *, force: bool, partitions: Iterable[int] | None = None) -> None:
        now = time.monotonic()
        if not force and now < self._next_commit:
            return
        self._next_commit = now + self.config.commit_interval_s
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for partition in partitions if partitions is not None else list(self._states):
            state = self._states.get(partition)
            offset = state.commit_offset() if state is not None else None
            if offset is not None and self._committed.get(partition) != offset:
                tp = TopicPartition(self.config.marker_topic, partition)
                offsets[tp] = OffsetAndMetadata(offset, "", -1)
        if not offsets:
            return
        try:
            self._kc.commit(offsets)
        except KafkaError as exc:
            log.warning("offset commit failed (%r); the next owner replays a little more", exc)
            return
        for tp, meta in offsets.items():
            self._committed[tp.partition] = meta.offset

    def _log_stats(self) -> None:
        now = time.monotonic()
        if now < self._next_stats:
            return
        self._next_stats = now + self.config.stats_interval_s
        stats = self.stats()
        log.info("stats: %s", " ".join(f"{k}={v}" for k, v in sorted(stats.items())))

    def _shutdown(self) -> None:
        try:
            self._commit(force=True)
        finally:
            try:
                self._kc.close(autocommit=False)
                self._reader.close()
                self._pauses.close()
            finally:
                self._producer.flush(timeout=self.config.request_timeout_ms / 1000)
                self._producer.close(timeout=5)
                if self._txn is not None:
                    self._txn.close(timeout=5)
        log.info("stopped: %s", " ".join(f"{k}={v}" for k, v in sorted(self.stats().items())))

    # -- rebalance --------------------------------------------------------------------

    def _rebalanced(self) -> None:
        """Apply the rebalances the listener saw, in order, on the run loop's thread."""
        for assigned, partitions in self._listener.take():
            if assigned:
                self._on_assigned(partitions)
            else:
                self._on_revoked(partitions)

    def _on_revoked(self, revoked: list[int]) -> None:
        partitions = [p for p in revoked if p in self._states]
        if not partitions:
            return
        # May fail (the group has moved on): the next owner then replays a little more.
        self._commit(force=True, partitions=partitions)
        for partition in partitions:
            self._fresh.discard(partition)
            state = self._states.pop(partition)
            self._retired.update(state.stats)
            self._committed.pop(partition, None)
        self._caught_up.clear()
        log.info("revoked partitions %s", sorted(partitions))

    def _on_assigned(self, assigned: list[int]) -> None:
        for partition in assigned:
            if partition in self._states:
                continue
            state = self._states[partition] = PartitionState(
                partition, default_lease_s=self.config.default_redelivery_timeout_s
            )
            # Replay exactly from the committed offset, whatever was fetched before.
            committed = self._kc.committed(TopicPartition(self.config.marker_topic, partition))
            if committed is not None:
                state.set_position(committed)
            self._fresh.add(partition)
        self._caught_up.clear()
        log.info("assigned partitions %s", self.partitions())


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Only records what happened. kafka-python 3 calls it on its IO thread, where neither
    a blocking commit nor touching the tracker's state (owned by the run loop) is safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[tuple[bool, list[int]]] = []

    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        with self._lock:
            self._events.append((False, [tp.partition for tp in revoked]))

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        with self._lock:
            self._events.append((True, [tp.partition for tp in assigned]))

    def take(self) -> list[tuple[bool, list[int]]]:
        with self._lock:
            events, self._events = self._events, []
        return events
