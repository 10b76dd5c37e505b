"""The Kafka adapter around :class:`tracker.state.PartitionState`: reads markers through a
consumer group, performs due redeliveries, commits what is safe."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from kmq.errors import MarkerDecodeError
from kmq.markers import Marker, MarkerType, decode_all, encode
from kmq.pause import ControlWatcher
from kmq.records import dead_letter_headers, queue_headers
from tracker.config import TrackerConfig
from tracker.state import PartitionState, Redeliver, complete

log = logging.getLogger("kmq.tracker")

_DEAD_LETTER_HEADROOM_BYTES = 64 * 1024
"""A copy is never larger than the START it comes from, which the SDK kept within
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
        self._membership_ok = True
        self._confirmed_at = float("-inf")
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
            isolation_level="read_committed",
            request_timeout_ms=config.request_timeout_ms,
            fetch_max_wait_ms=50,
        )
        self._producer = KafkaProducer(
            bootstrap_servers=config.bootstrap_servers,
            client_id=f"{config.client_id}-producer",
            acks="all",
            enable_idempotence=True,
            linger_ms=2,
            max_request_size=config.max_message_bytes + _DEAD_LETTER_HEADROOM_BYTES,
            request_timeout_ms=config.request_timeout_ms,
        )

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
        if not self._membership_current(now):
            return
        budget = self.config.max_redeliveries_per_round
        actions: list[Redeliver] = []
        for state in self._states.values():
            if len(actions) >= budget:
                break
            actions.extend(state.due(now, budget - len(actions)))
        if not actions:
            return
        actions = [a for a in self._with_payloads(actions) if not self._held_by_pause(a, now)]
        if not actions:
            return
        unfinished = {id(action): action for action in actions}
        try:
            if self._txn is not None:
                self._redeliver_in_transaction(actions, self._txn)
                unfinished.clear()
            else:
                self._redeliver_plainly(actions, unfinished)
        finally:
            # Whatever did not get through is due again: never leave one marked in progress.
            for action in unfinished.values():
                self._state_failed(action)

    def _membership_current(self, now: float) -> bool:
        """Whether the group surely still counts this replica as its partitions' owner.

        A replica frozen longer than its session timeout (a "zombie": a stop signal, a
        swapped-out VM, a long GC-like stall) has been evicted and its partitions handed to
        another replica, which redelivers the expired leases; on waking, its own state says
        the same leases are overdue. It must not act on them until the coordinator has
        answered it again, so redeliveries wait until a heartbeat sent within two thirds of the
        session timeout has been answered, or a join completed, and no rejoin is pending. The
        broker fences the zombie's offset commits by itself.
        """
        confirmed_at = _membership_confirmed_at(self._kc, self._confirmed_at)
        if confirmed_at is None:
            return True  # not a kafka-python we know: nothing to judge by
        self._confirmed_at = confirmed_at
        current = now - confirmed_at < self.config.session_timeout_ms / 1000 * 2 / 3
        if current != self._membership_ok:
            self._membership_ok = current
            if current:
                log.info("group membership confirmed again: redeliveries resume")
            else:
                log.warning(
                    "no heartbeat answered for %.1f s: holding redeliveries until the group "
                    "confirms this replica (another may own its partitions now)",
                    now - confirmed_at,
                )
        return current

    def _redeliver_plainly(
        self, actions: list[Redeliver], unfinished: dict[int, Redeliver]
    ) -> None:
        timeout_s = self.config.request_timeout_ms / 1000
        copies = [(action, self._send_copy(self._producer, action)) for action in actions]
        records = []
        for action, future in copies:
            try:
                future.get(timeout=timeout_s)
            except KafkaError as exc:
                log.warning("redelivery of %s failed (%r); retrying", action.message_id, exc)
                continue
            # The copy is out: from here on the delivery counts as done, marker or not.
            del unfinished[id(action)]
            try:
                records.append((action, self._send_marker(self._producer, action)))
            except KafkaError as exc:
                log.error("marker for %s not written (%r)", action.message_id, exc)
                self._done(action)
        for action, future in records:
            try:
                future.get(timeout=timeout_s)
            except KafkaError as exc:
                # Nothing is lost; without the marker a restarted tracker may redeliver it once
                # more.
                log.error("marker for %s not written (%r)", action.message_id, exc)
            self._done(action)

    def _redeliver_in_transaction(self, actions: list[Redeliver], txn: KafkaProducer) -> None:
        """Copies, their markers and the markers-offset commit that skips them: all or none."""
        settled: dict[int, list[int]] = {}
        for action in actions:
            settled.setdefault(action.marker_partition, []).append(action.start_offset)
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for partition, starts in settled.items():
            state = self._states.get(partition)
            offset = state.commit_offset(starts) if state is not None else None
            if offset is not None:
                tp = TopicPartition(self.config.marker_topic, partition)
                offsets[tp] = OffsetAndMetadata(offset, "", -1)
        try:
            txn.begin_transaction()
            for action in actions:
                self._send_copy(txn, action)
                self._send_marker(txn, action)
            if offsets:
                txn.send_offsets_to_transaction(offsets, self._kc.group_metadata())
            txn.commit_transaction()
        except KafkaError as exc:
            log.warning("redelivery transaction failed (%r); retrying", exc)
            with contextlib.suppress(KafkaError):
                txn.abort_transaction()
            for action in actions:
                self._state_failed(action)
            return
        for tp, meta in offsets.items():
            self._committed[tp.partition] = meta.offset
        for action in actions:
            self._done(action)

    def _send_marker(self, producer: KafkaProducer, action: Redeliver) -> Any:
        kind = MarkerType.DEAD_LETTERED if action.dead_letter_queue else MarkerType.REDELIVERED
        marker = Marker(
            type=kind,
            queue=action.queue,
            partition=action.delivery[0],
            offset=action.delivery[1],
            message_id=action.message_id,
            attempt=action.attempt,
            reason=action.reason,
            dead_letter_queue=action.dead_letter_queue or "",
        )
        # The partition its START came from, where every marker of the message belongs.
        return producer.send(
            self.config.marker_topic,
            key=action.message_id.encode(),
            value=encode(marker),
            partition=action.marker_partition,
        )

    def _done(self, action: Redeliver) -> None:
        if action.dead_letter_queue:
            log.info(
                "dead-lettered %s (queue %r -> %r after %d attempts, %s)",
                action.message_id, action.queue, action.dead_letter_queue,
                action.attempt, action.reason,
            )  # fmt: skip
        else:
            log.info(
                "redelivered %s (queue %r, attempt %d, %s)",
                action.message_id, action.queue, action.attempt, action.reason,
            )  # fmt: skip
        owner = self._states.get(action.marker_partition)
        if owner is not None:
            owner.redelivered(action.delivery, dead_lettered=bool(action.dead_letter_queue))

    def _held_by_pause(self, action: Redeliver, now: float) -> bool:
        """Postpone ``action`` if its queue is paused; look again within a second."""
        until_ms = self._pauses.paused_until_ms(action.queue)
        if not until_ms:
            return False
        state = self._states.get(action.marker_partition)
        if state is not None:
            remaining_s = until_ms / 1000 - time.time()
            state.postpone(action.delivery, now + min(1.0, max(remaining_s, 0.0)))
        return True

    def _with_payloads(self, actions: list[Redeliver]) -> list[Redeliver]:
        """Fill in key, value and headers from each START marker, re-read from the log: the
        state does not keep payloads, so its memory does not grow with their size."""
        by_partition: dict[int, list[Redeliver]] = {}
        for action in actions:
            by_partition.setdefault(action.marker_partition, []).append(action)
        loaded = []
        for partition, wanted in by_partition.items():
            starts: dict[tuple[int, int], Marker] = {}
            scanned: list[tuple[int, int]] = []  # [from, to) ranges read through
            try:
                for cluster in _clusters(wanted):
                    found, reached = self._read_starts(partition, cluster)
                    starts.update(found)
                    scanned.append((cluster[0].start_offset, reached))
                    if reached <= cluster[-1].start_offset:
                        break  # out of time: the rest waits for the next round
            except KafkaError as exc:
                log.warning("cannot re-read STARTs in markers %d (%r); retrying", partition, exc)
            waiting = 0
            for action in wanted:
                start = starts.get(action.delivery)
                if start is not None:
                    loaded.append(complete(action, start))
                elif any(lo <= action.start_offset < hi for lo, hi in scanned):
                    # Read past its offset without finding it: only retention deleting a
                    # START still in flight leads here.
                    log.error(
                        "START of %s at markers %d:%d is gone; it cannot be redelivered",
                        action.delivery, partition, action.start_offset,
                    )  # fmt: skip
                    self._drop_unrecoverable(action)
                else:
                    waiting += 1
                    self._state_failed(action)
            if waiting:
                log.warning(
                    "markers %d: re-read of STARTs stopped at offset %s; %d redeliveries wait "
                    "for the next round",
                    partition, scanned[-1][1] if scanned else "-", waiting,
                )  # fmt: skip
        return loaded

    def _read_starts(
        self, partition: int, wanted: list[Redeliver]
    ) -> tuple[dict[tuple[int, int], Marker], int]:
        """The START markers of ``wanted``, read in one forward scan of the markers partition
        from the lowest START offset to the highest (plain or BATCH records), and the offset
        the scan reached. A slow broker may not let it reach the end in time: what it found
        so far still counts, so every round makes progress."""
        offsets = {action.start_offset for action in wanted}
        deliveries = {action.delivery for action in wanted}
        first, last = min(offsets), max(offsets)
        tp = TopicPartition(self.config.marker_topic, partition)
        self._reader.assign([tp])
        self._reader.seek(tp, first)
        found: dict[tuple[int, int], Marker] = {}
        reached = first
        # Only scanning past an offset proves a START there gone (retention moved the log
        # start past it); a scan that stalls proves nothing about what it did not reach.
        deadline = time.monotonic() + _SCAN_TIMEOUT_S
        while True:
            for batch in self._reader.poll(timeout_ms=200, max_records=_SCAN_RECORDS).values():
                for record in batch:
                    if record.offset in offsets:
                        with contextlib.suppress(MarkerDecodeError):
                            for marker in decode_all(record.value):
                                if marker.type is MarkerType.START and (
                                    marker.delivery in deliveries
                                ):
                                    found.setdefault(marker.delivery, marker)
                    reached = record.offset + 1
                    if record.offset >= last:
                        return found, reached
            if time.monotonic() >= deadline:
                return found, reached

    def _drop_unrecoverable(self, action: Redeliver) -> None:
        state = self._states.get(action.marker_partition)
        if state is not None:
            state.discard(action.delivery, "start_missing")

    def _send_copy(self, producer: KafkaProducer, action: Redeliver) -> Any:
        """Write the message again: to its own queue, or to its dead-letter queue."""
        if action.dead_letter_queue is None:
            return producer.send(
                self.config.queue_topic,
                key=action.key,
                value=action.value,
                headers=queue_headers(action.message_id, action.attempt, action.headers),
                partition=action.delivery[0],
            )
        headers = dead_letter_headers(
            action.message_id, action.queue, action.attempt, action.reason, action.headers
        )
        return producer.send(
            self.config.queue_topic,
            key=action.dead_letter_queue.encode(),
            value=action.value,
            headers=headers,
            partition=action.delivery[0],
        )

    def _state_failed(self, action: Redeliver) -> None:
        state = self._states.get(action.marker_partition)
        if state is not None:
            state.redelivery_failed(
                action.delivery, time.monotonic(), self.config.redelivery_retry_s
            )

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
                partition,
                default_lease_s=self.config.default_redelivery_timeout_s,
                keep_payloads=False,
            )
            # Replay exactly from the committed offset, whatever was fetched before.
            committed = self._kc.committed(TopicPartition(self.config.marker_topic, partition))
            if committed is not None:
                state.set_position(committed)
            self._fresh.add(partition)
        self._caught_up.clear()
        log.info("assigned partitions %s", self.partitions())


_SCAN_TIMEOUT_S = 5.0
"""How long one re-read scan may take; what it has not reached by then waits a round."""

_SCAN_RECORDS = 500
"""Records per poll of a re-read scan."""

_SCAN_GAP = 5000
"""START offsets further apart than this are fetched by separate seeks, not one scan."""


def _clusters(actions: list[Redeliver]) -> list[list[Redeliver]]:
    ordered = sorted(actions, key=lambda a: a.start_offset)
    clusters: list[list[Redeliver]] = [[ordered[0]]]
    for action in ordered[1:]:
        if action.start_offset - clusters[-1][-1].start_offset > _SCAN_GAP:
            clusters.append([])
        clusters[-1].append(action)
    return clusters


def _membership_confirmed_at(consumer: KafkaConsumer, known: float) -> float | None:
    """Monotonic time at which ``consumer``'s group coordinator last surely counted it a
    member in good standing: the *send* time of the latest answered heartbeat (an answer
    processed late, after a freeze, says nothing about the freeze), or a completed join.
    ``known`` is what the previous call returned. -inf while it is not a member in good
    standing (rejoining, asked to rejoin, kicked out); None if this kafka-python keeps none
    of this where we look."""
    coordinator = getattr(consumer, "_coordinator", None)
    heartbeat = getattr(coordinator, "heartbeat", None)
    stable = getattr(coordinator, "stable", None)
    need_rejoin = getattr(coordinator, "need_rejoin", None)
    times = [getattr(heartbeat, name, None) for name in ("last_send", "last_receive", "last_reset")]
    if not (callable(stable) and callable(need_rejoin)) or not all(
        isinstance(t, float) for t in times
    ):
        return None
    last_send, last_receive, last_reset = (float(t) for t in times)  # type: ignore[arg-type]
    if not stable() or need_rejoin():
        return float("-inf")
    confirmed = max(known, last_reset)
    if last_receive >= last_send:  # the latest heartbeat was answered (the loop is serial)
        confirmed = max(confirmed, last_send)
    return confirmed


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
