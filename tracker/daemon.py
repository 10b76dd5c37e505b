"""The tracker's loop: owns markers partitions through a consumer group, reads them apart
from it (by ``assign()``, so reading goes on while the group rebalances) into one
:class:`tracker.state.PartitionState` per owned partition, probes how far it has read,
re-reads due deliveries' records (:mod:`tracker.reread`) and redelivers them in one fenced
transaction per markers partition (:mod:`tracker.redeliver`, :mod:`tracker.fencing`),
and commits what is safe."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    RequestTimedOutError,
)
from kafka.producer.future import RecordMetadata
from kafka.structs import MemberState, OffsetAndMetadata

from kmq import kafka_clients, reach, txn_wait
from kmq.config import COOPERATIVE
from kmq.control import UNREAD_VALUE, ControlWatcher, unread_key
from kmq.errors import BrokerError, ConfigError, KmqError
from kmq.layout import holders_reads, write_partitions
from kmq.markers import QUEUE_LANE, RETRY_LANE, Entry, MarkerType, encode_entries
from kmq.records import delivery_key, split_key
from tracker.config import TrackerConfig
from tracker.dating import WriteDates
from tracker.fencing import FenceWatch, PartitionWriters, Tenure
from tracker.handover import BEACON_S, ClockBounds, beacon_text
from tracker.health import BrokerLink, ProbeServer
from tracker.holds import HeldLeases, hold_reason
from tracker.notices import UnreadNotices
from tracker.orphans import OwnerWatch, owns_text, ready_text
from tracker.peek import OwnsPeek, to_peek
from tracker.readers import BUSY_S, LATELY_S, LiveReaders
from tracker.redeliver import TXN_TIMEOUT_S, Copy, Redeliverer, RoundOutcome, copy_of
from tracker.reread import FETCH_MAX_BYTES, FETCH_WAIT_MS, RecordReader
from tracker.stall import Change, Stall
from tracker.state import Due, PartitionState, floor_ms, share_budget
from tracker.view import TrackerView, partition_view
from tracker.vouch import Voucher, vouch_due

log = logging.getLogger("kmq.tracker")

_DEAD_LETTER_HEADROOM_BYTES = 64 * 1024
"""A copy is never larger than the record it comes from, which the SDK kept within
max_message_bytes; a dead letter also carries its origin and last reason as headers. This
only loosens kafka-python's client-side check: the broker's own limit still applies."""
_TXN_RETRY_BACKOFF_MS = 20
"""kafka-python's wait before each transactional request it re-queues (default 100 ms)."""
_TXN_BOOTSTRAP_MS = 1000
"""How long building a partition's transactional producer may wait for the cluster."""
MARKERS_FETCH_WAIT_MS = 500
"""The markers reader's ``fetch_max_wait_ms``: the re-read consumer's
(:data:`tracker.reread.FETCH_WAIT_MS`), for the same reason. The embedded broker lists a
partition's stored batches from the first on every fetch, each partition of a request in
turn within what is left of the one wait, and answers a partition whose listing had not
reached its fetch offset with nothing. At 100 ms, in full chaos run 57 (markers partitions
of some 60,000 records by mid-run, 2 cores shared with a dozen processes), trackers' markers
readers read nothing for 3 s or more 174 times, 40 of them with no injected fault within a
second. One of those, 5 s long as its peer was killed, kept the replica from adopting the
peer's partitions (silence is judged by its own beacons read back): part of the delay of the
run's slowest copies. On Kafka a fetch with records to return never waits. The cost, on
the embedded broker: a probe that lands while a fetch waits at a partition's end is
answered at the broker's next look, up to half the wait later (it waited 50, then 100 ms:
README, Probes). Alternated three times against 100 ms, the redelivery benchmark's 1 %
p50 was about 190 ms worse and its p99 about 400 ms; full chaos run 58 had 106 copies over
10 s late (run 57: 381)."""
CLAIM_WAIT_MAX_S = 30.0
"""How long a replica given a markers partition waits, at most, for a live replica that
still names it (in its beacons' owns entries) to let it go before claiming it anyway
(:meth:`Tracker._claim_many`). Longer than :data:`KEEP_THROUGH_REBALANCE_S` plus one
transaction's calls (10 s), so a holder stuck in a long rebalance has stopped by then."""
HANDOFF_MAX_S = 20.0
"""How long a replica goes on serving a markers partition the group has given to another
replica, waiting for that one to say it has replayed it (:meth:`Tracker._hand_off`). Well
below :data:`CLAIM_WAIT_MAX_S`, so that the assignee's claim made anyway meets no
transaction of this one's."""
KEEP_THROUGH_REBALANCE_S = 15.0
"""How long an eager rebalance may last before the replica stops redelivering from the
partitions it keeps through it (:meth:`Tracker._holding`)."""
_UNREACHABLE = (KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, RequestTimedOutError)
"""Errors that mean Kafka cannot be reached, rather than that a request was refused."""


def markers_wait_ms(states: Iterable[PartitionState], now: float, longest_ms: int) -> int:
    """How long the loop may wait for markers: ``longest_ms``, or until the next deadline
    passes, so that its probe (and then its redelivery) goes out when it is due, not when
    the next marker happens to arrive. Deadlines already passed do not shorten it (they
    wait for a probe read back, which is a marker)."""
    wait_ms = longest_ms
    for state in states:
        deadline = state.next_wake(now)
        if deadline is not None:
            wait_ms = min(wait_ms, math.ceil((deadline - now) * 1000))
    return max(wait_ms, 1)


class Tracker:
    """One kmq-tracker replica. :meth:`run` connects (retrying until Kafka answers) and
    blocks until :meth:`stop` is called."""

    _kc: KafkaConsumer
    _mc: KafkaConsumer
    _reader: KafkaConsumer
    _producer: KafkaProducer
    _pauses: ControlWatcher
    _records: RecordReader

    def __init__(self, config: TrackerConfig) -> None:
        self.config = config
        self._states: dict[int, PartitionState] = {}
        self._retired: Counter[str] = Counter()
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._committed: dict[int, int] = {}
        self._fresh: set[int] = set()  # assigned, first batch not read yet
        self._stalls: dict[int, Stall] = {}
        self._kept: set[int] = set()
        """Given up by an eager rebalance, or adopted from a silent owner (:meth:`_adopt`):
        read, never committed (fenced if another replica claims them), until the group's
        next assignment says which stay. Adopted ones are redelivered from meanwhile, but
        not during a rebalance (:meth:`_holding`)."""
        self._rebalancing = False
        """An eager rebalance is under way (its revoke seen, its assignment not yet): see
        :meth:`_holding` and :meth:`_on_revoked`."""
        self._rebalance_began: float | None = None
        """When this replica first saw the rebalance under way (monotonic)."""
        self._handing: dict[int, float] = {}
        """With handoff: partitions the group gives to another replica that this one goes on
        reading and redelivering from, never committing, until that one has replayed them
        (:meth:`_hand_off`), and since when."""
        self._claim_wanted: dict[int, float] = {}
        """Partitions held whose claim waits for another replica to let them go, and since
        when (:meth:`_claim_many`)."""
        self._reclaim: set[int] = set()
        """Kept through a rebalance and assigned again: claim them again, and wait for a
        probe written since, before the next redelivery from them."""
        self._reading: set[int] = set()  # what the markers reader is assigned
        self._seek: set[int] = set()  # new states: start the markers reader at their position
        self._next_commit = 0.0
        self._next_stats = time.monotonic() + config.stats_interval_s
        self._nonce = random.getrandbits(32) or 1  # 0 marks a consumer's PROBE (kmq.consumer)
        """Marks this replica's PROBE markers: only its own tell it how far it has read.
        Also names its clock, in its ticks and beacons (:mod:`tracker.handover`)."""
        self._clocks = ClockBounds(self._nonce)
        self._owners = (
            OwnerWatch(self._nonce, config.adopt_after_s) if config.adopt_after_s else None
        )
        self._peek: OwnsPeek | None = None
        """Reads *owns* entries past a held partition's last stable offset (built with the
        clients, when replicas adopt: :mod:`tracker.peek`)."""
        self._handoff = self._owners is not None and config.tick_interval_s > 0
        """Whether claims wait for the holder to let go (beacons say who holds what), so
        that an eager rebalance need not stop redelivery (:meth:`_claim_many`)."""
        self._next_beacon = 0.0
        self._beacon_partitions = 0
        """How many markers partitions the last beacon went to (the voucher writes to those)."""
        self._voucher = Voucher(self._vouch_due, self._vouch)
        self._acked: dict[int, tuple[int, float]] = {}
        """Per markers partition, this replica's last PROBE the broker acknowledged: its
        offset, and when (monotonic); the next tick passes it on to a successor."""
        self._link = BrokerLink(config.bootstrap_servers, config.session_timeout_ms / 1000)
        self._connected = False
        self._assignment_known = False
        self._last_turn = time.monotonic()
        self._slowest_turn_s = 0.0
        self._slowest_redelivery_s = 0.0
        self._slowest_reread_s = 0.0
        self._slowest_txn_s = 0.0
        self._slowest_behind_s = 0.0
        self._last_read = time.monotonic()
        """When the markers reader last returned a record, or had nothing in flight."""
        self._longest_read_gap_s = 0.0
        self._writers = PartitionWriters(
            self._transactional_producer,
            config.group_id,
            config.marker_topic,
            init=txn_wait.init,
        )
        self._fence_watch = FenceWatch(settle_s=config.session_timeout_ms / 1000)
        self._tenure = Tenure()
        self._notices = UnreadNotices()
        self._topics = {QUEUE_LANE: config.queue_topic, RETRY_LANE: config.retry_topic}
        self._readers = LiveReaders()
        self._dates = WriteDates(self._readers.fresh_s)
        self._held = HeldLeases()
        self._redeliverer = Redeliverer(
            config.queue_topic,
            config.retry_topic,
            config.marker_topic,
            self._partitions_of,
            live=lambda queue: self._live(queue, time.monotonic()),
            lately=lambda queue: self._live(queue, time.monotonic(), LATELY_S),
            busy=lambda queue: self._live(queue, time.monotonic(), BUSY_S),
            watch_copies=config.unread_copy_s > 0,
        )

    def _open(self) -> None:
        """Build every Kafka client (:class:`kmq.BrokerError` if Kafka cannot be reached);
        a failure closes the clients already built."""
        config = self.config
        conn = config.connection
        opened: list[Callable[[], object]] = []
        try:
            self._open_clients(config, conn, opened)
        except BaseException:
            for close in reversed(opened):
                with contextlib.suppress(Exception):
                    close()
            raise
        self._records = RecordReader(self._reader, self._topics)

    def _open_clients(
        self,
        config: TrackerConfig,
        conn: kafka_clients.KafkaConnection,
        opened: list[Callable[[], object]],
    ) -> None:
        self._kc = kafka_clients.consumer(  # installs kmq.join_fix: a group member
            conn,
            None,  # the tracker's own client id, as is
            group_id=config.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=max(100, config.session_timeout_ms // 4),
            request_timeout_ms=max(config.request_timeout_ms, config.session_timeout_ms + 5000),
            fetch_max_wait_ms=100,
            partition_assignment_strategy=(
                [CooperativeStickyAssignor]
                if config.rebalance == COOPERATIVE
                # Sticky first, so a replica keeps what it had when another one comes or
                # goes; range and round robin so replicas of kmq before it can share the group.
                else [StickyPartitionAssignor, RangePartitionAssignor, RoundRobinPartitionAssignor]
            ),
        )
        opened.append(lambda: self._kc.close(autocommit=False))
        self._listener = _Listener(lambda: self._kc.group_metadata().generation_id)
        self._kc.subscribe([config.marker_topic], listener=self._listener)
        # The group's committed offsets, read by a client of the group that never joins
        # it: the member's coordinator connection holds its JoinGroup at the broker for a
        # whole rebalance, and a committed() sent behind it can wait as long (a broker
        # answers a connection's requests in order; in full chaos run 86 two lookups by the
        # member, adopting a killed replica's partitions in a rebalance, took 3.7 s).
        self._offsets = kafka_clients.consumer(
            conn, "offsets", group_id=config.group_id, enable_auto_commit=False
        )
        opened.append(lambda: self._offsets.close(autocommit=False))
        # The group member fetches nothing (its partitions stay paused): kafka-python fetches
        # nothing for a group while it rebalances, and a replica that keeps its partitions
        # through a rebalance must keep reading them. This one, in no group, reads them.
        self._mc = kafka_clients.consumer(
            conn,
            "markers",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            fetch_max_wait_ms=MARKERS_FETCH_WAIT_MS,
        )
        opened.append(self._mc.close)
        if self._owners is not None:
            peek = kafka_clients.consumer(
                conn,
                "peek",
                enable_auto_commit=False,
                auto_offset_reset="latest",
                isolation_level="read_uncommitted",  # owns entries only: tracker.peek
                fetch_max_wait_ms=MARKERS_FETCH_WAIT_MS,
            )
            self._peek = OwnsPeek(peek, config.marker_topic)
            opened.append(self._peek.close)
        self._pauses = ControlWatcher(conn, config.control_topic)
        opened.append(self._pauses.close)
        self._reader = kafka_clients.consumer(
            conn,
            "reader",
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # below the log start: read on, and call it gone
            isolation_level="read_committed",
            fetch_max_wait_ms=FETCH_WAIT_MS,
            fetch_max_bytes=FETCH_MAX_BYTES,
            max_partition_fetch_bytes=FETCH_MAX_BYTES,
        )
        opened.append(self._reader.close)
        # Copies and dead letters, outside the rounds' transactions (tracker.redeliver).
        self._copies = kafka_clients.producer(
            conn,
            "copies",
            acks="all",
            enable_idempotence=True,
            max_request_size=config.max_message_bytes + _DEAD_LETTER_HEADROOM_BYTES,
            batch_size=kafka_clients.batch_bytes(config.max_message_bytes),
        )
        opened.append(lambda: kafka_clients.close_producer(self._copies, 5))
        self._producer = kafka_clients.producer(  # PROBE markers only: they change nothing
            conn,
            "producer",
            acks="all",
            enable_idempotence=True,
        )

    def _transactional_producer(self, transactional_id: str) -> KafkaProducer:
        config = self.config
        return kafka_clients.producer(
            config.connection,
            "txn",
            transactional_id=transactional_id,
            # kafka-python waits this long before each transactional request it re-queues, and
            # a partition's first round re-queues twice (finding the group's coordinator for
            # its offsets): 200 ms of every first redelivery with the default 100.
            retry_backoff_ms=_TXN_RETRY_BACKOFF_MS,
            # How long send() may block the loop waiting for a topic's metadata (a claim's
            # init_transactions() waits fencing.CLAIM_WAIT_S instead: kmq.txn_wait.init).
            max_block_ms=int(TXN_TIMEOUT_S * 1000),
            # The constructor connects before it returns, on the loop's thread: while Kafka
            # cannot be reached, a claim gives up after this and is retried next turn
            # (kafka-python's default, the request timeout, froze the loop for 30 s), and
            # without a probe of why, which could wait 5 s more for a connection.
            bootstrap_timeout_ms=_TXN_BOOTSTRAP_MS,
            explain=False,
            acks="all",
            enable_idempotence=True,
            max_request_size=config.max_message_bytes + _DEAD_LETTER_HEADROOM_BYTES,
            batch_size=kafka_clients.batch_bytes(config.max_message_bytes),
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

    def live_readers(self, queue: str) -> frozenset[int]:
        """The retry-topic partitions of ``queue`` that consumers have lately said they read
        (:class:`tracker.readers.LiveReaders`): where its copies go first."""
        return self._readers.live(queue, time.monotonic())

    def stats(self) -> Counter[str]:
        total = Counter(self._retired)
        for state in list(self._states.values()):
            total.update(state.stats)
        states = list(self._states.values())
        total["in_flight"] = sum(s.in_flight for s in states)
        total["watched"] = sum(s.watched for s in states)
        return total

    def view(self) -> TrackerView:
        """What metrics and probes show, read from any thread without stopping the loop."""
        now = time.monotonic()
        partitions = tuple(
            sorted((partition_view(s, now, self._stalls.get(s.partition))
                    for s in list(self._states.values())),
                   key=lambda p: p.partition)
        )  # fmt: skip
        totals = Counter(dict(self._retired))
        for p in partitions:
            totals.update(p.stats)
        totals["in_flight"] = sum(p.in_flight for p in partitions)
        coordinator = getattr(self._kc, "_coordinator", None) if self._connected else None
        return TrackerView(
            connecting=not self._connected,
            broker_up=self._link.up,
            broker_problem=self._link.problem,
            group_stable=getattr(coordinator, "state", None) == MemberState.STABLE,
            assignment_known=self._assignment_known,
            last_turn_age_s=now - self._last_turn,
            partitions=partitions,
            totals=dict(totals),
        )

    # -- loop -------------------------------------------------------------------------

    def run(self) -> None:
        log.info(
            "started: markers %s, queue %s, group %s",
            self.config.marker_topic,
            self.config.queue_topic,
            self.config.group_id,
        )
        probes = self._start_probes()
        try:
            if self._connect():
                if self._owners is not None and self.config.tick_interval_s > 0:
                    self._voucher.start()
                self._loop()
        finally:
            if probes is not None:
                probes.close()

    def _start_probes(self) -> ProbeServer | None:
        if not self.config.metrics_port:
            return None
        from tracker import metrics  # prometheus_client only when it is used

        port = self.config.metrics_port
        try:
            server = ProbeServer(
                port, self.view, metrics.registry(self.view), self.config.liveness_timeout_s
            )
        except OSError as exc:
            why = exc.strerror or exc
            raise ConfigError(f"cannot serve metrics on port {port}: {why}") from exc
        return server.start()

    def _connect(self) -> bool:
        """Build the clients, retrying with backoff until Kafka answers; False if stopped
        first. Says once why Kafka cannot be reached, and again only if the cause changes."""

        def attempt() -> None:
            self._last_turn = time.monotonic()
            try:
                self._open()
            except (KmqError, KafkaError) as exc:
                self._retired["connect_failed"] += 1
                self._link.problem = str(exc)
                if isinstance(exc, BrokerError):
                    raise
                raise BrokerError(str(exc)) from exc

        if not reach.until_reachable(attempt, log, self._stop):
            return False
        self._connected = True
        self._link.connected(time.monotonic())
        return True

    def _loop(self) -> None:
        backoff_s = 0.1
        try:
            while not self._stop.is_set():
                began = self._last_turn = time.monotonic()
                self._link.begin_round()
                try:
                    self._round()
                except KafkaError as exc:
                    # Broker trouble (a stall, a reset, a rebalance): keep the state, retry.
                    self._trouble(exc, "round failed; retrying in %.1f s", backoff_s)
                    self._stop.wait(backoff_s)
                    backoff_s = min(backoff_s * 2, 5.0)
                    continue
                ended = time.monotonic()
                self._link.end_round(self._coordinator_known(), ended)
                self._slowest_turn_s = max(self._slowest_turn_s, ended - began)
                if self._link.up:
                    backoff_s = 0.1
        finally:
            self._voucher.close()  # before the producer it writes with
            self._shutdown()

    def _coordinator_known(self) -> bool:
        """Whether the group coordinator is known and connected (kafka-python's own check,
        as its poll makes on this thread)."""
        coordinator = getattr(self._kc, "_coordinator", None)
        try:
            return coordinator is not None and not coordinator.coordinator_unknown()
        except Exception:  # an internal of kafka-python 3.0: never let it stop the loop
            return False

    def _trouble(self, exc: KafkaError, message: str, *args: object) -> None:
        """Log a failed Kafka call, but while Kafka is unreachable only the one line
        :class:`BrokerLink` writes when it is lost (and at DEBUG the rest)."""
        if isinstance(exc, _UNREACHABLE):
            self._link.failed(_cause(exc), time.monotonic())
            log.debug(f"{message} (%r)", *args, exc)
        else:
            log.warning(f"{message} (%r)", *args, exc)

    def _round(self) -> None:
        self._rebalanced()
        # Membership only (heartbeats, joins, the listener); what it fetches is dropped.
        self._kc.poll(timeout_ms=0 if self._states else self.config.poll_timeout_ms)
        self._rebalanced()
        self._retake_fenced()
        self._follow_states()
        records = (
            self._mc.poll(
                timeout_ms=markers_wait_ms(
                    self._states.values(), time.monotonic(), self.config.poll_timeout_ms
                ),
                max_records=5000,
            )
            if self._reading
            else {}
        )
        now = time.monotonic()
        self._note_read(bool(records), now)
        for tp, batch in records.items():
            state = self._states.get(tp.partition)
            if state is None:
                continue
            if tp.partition in self._fresh:
                self._fresh.discard(tp.partition)
                if state.position is not None and batch[0].offset > state.position:
                    # Fetched before the seek to where its state starts: read from there.
                    self._mc.seek(tp, state.position)
                    continue
            readers, dates = self._readers, self._dates
            monotonic = time.monotonic
            for record in batch:
                # The clock is read per record, not per poll: a lease runs from reading its
                # marker either way, and the STARTs of one poll (thousands, from many
                # consumers) then do not all share one deadline, among which the deadline
                # list would search linearly for each END (a third of the tracker's time
                # at 16 queues).
                state.on_record(record.offset, record.value, monotonic())
                if record.headers:
                    # Dated by when it was written, not read: read late, a killed
                    # consumer's claim would count as live (tracker.dating).
                    written = dates.latest(tp.partition, record.offset, now)
                    if written is not None:
                        readers.note(record.headers, written)
        self._sync_offsets()
        self._peek_owns()
        self._adopt()
        self._yield_adopted()
        self._hand_off()
        self._probe()
        began = time.monotonic()
        self._redeliver()
        self._slowest_redelivery_s = max(self._slowest_redelivery_s, time.monotonic() - began)
        self._notice_unread()
        self._commit(force=False)
        self._log_stats()

    def _note_read(self, read: bool, now: float) -> None:
        """Time the gaps between polls that return markers (``read_gap_max_ms``), counted
        only while messages are in flight: ticks and beacons then come every
        ``tick_interval_s``, so a long gap means the reading stopped, not the writing."""
        if read or not any(s.in_flight for s in self._states.values()):
            self._last_read = now
        else:
            self._longest_read_gap_s = max(self._longest_read_gap_s, now - self._last_read)

    def _follow_states(self) -> None:
        """Have the markers reader read exactly the partitions with a state, each new one
        from its state's position, and keep the group member from fetching."""
        topic = self.config.marker_topic
        want = set(self._states)
        if want != self._reading:
            self._mc.assign([TopicPartition(topic, p) for p in sorted(want)])
            self._seek |= want - self._reading
            self._reading = want
        for partition in sorted(self._seek & want):
            tp = TopicPartition(topic, partition)
            position = self._states[partition].position
            if position is None:
                self._mc.seek_to_beginning(tp)
            else:
                self._mc.seek(tp, position)
        self._seek.clear()
        fetching = set(self._kc.assignment()) - set(self._kc.paused())
        if fetching:
            self._kc.pause(*fetching)

    def _sync_offsets(self) -> None:
        for partition, state in list(self._states.items()):
            tp = TopicPartition(self.config.marker_topic, partition)
            try:
                position = self._mc.position(tp)
            except KafkaError as exc:
                self._trouble(exc, "partition %d: position unknown yet", partition)
                continue
            if state.position is None:
                state.set_position(position)
            elif partition not in self._fresh:
                # Past the last record it handed us: transaction markers (every redelivery
                # round ends with one) take offsets too.
                state.skip_to(position)
            highwater = self._mc.highwater(tp)
            if highwater is not None:
                state.set_end_offset(highwater)  # the first one only: the replay gate
                state.highwater = highwater
                self._dates.observe(partition, highwater, time.monotonic())
            self._watch_stall(partition, position, highwater)
            if state.replay_leases is not None:
                # Its replay just ended: say so at once in the *ready* entry, which a
                # holder handing it over waits for (_hand_off), not at the next beacon.
                self._next_beacon = 0.0
            self._log_replay_leases(partition, state)
        if (
            self._states
            and not self._caught_up.is_set()
            and not any(s.replaying for s in self._states.values())
        ):
            log.info("caught up on partitions %s", self.partitions())
            self._retired["caught_up"] += 1
            self._caught_up.set()

    def _watch_stall(self, partition: int, position: int, highwater: int | None) -> None:
        stall = self._stalls.get(partition)
        if stall is None:
            stall = self._stalls[partition] = Stall(self.config.stalled_after_s)
        now = time.monotonic()
        # Nothing is read while Kafka cannot be reached either; that has its own report.
        change = stall.observe(position if self._link.up else None, highwater, now)
        self._slowest_behind_s = max(self._slowest_behind_s, stall.behind_for(now))
        if change is Change.STALLED:
            self._retired["stalled"] += 1
            log.error(
                "markers partition %d: reading has stood at offset %d, below the high "
                "watermark %s, for %.0f s: a transaction the broker has not ended holds "
                "it, and nothing written there after it is tracked or redelivered until "
                "it ends",
                partition, position, highwater, stall.stalled_for(now),
            )  # fmt: skip
        elif change is Change.RESUMED:
            log.warning("markers partition %d: no longer stalled (offset %d)",
                        partition, position)  # fmt: skip

    def _probe(self) -> None:
        """Where a deadline has passed by the clock but not yet by the log, write a PROBE
        to the partition: once it is read back, everything written before it has been
        read, and only then are those deadlines acted on (a tracker that fell behind its
        markers never redelivers a message whose END it has not read yet)."""
        now = time.monotonic()
        tick_s = self.config.tick_interval_s
        for partition, state in list(self._states.items()):
            self._probe_partition(partition, state, now)
            if state.tick_needed(now, tick_s):
                entry, text = state.tick(now, self._acked.get(partition))
                self._send_probe(partition, [entry], [text])
        # Beacons go out from a replica holding nothing yet too: on the partitions it is
        # given later, its own beacons in the replay then bound each lease on its own clock
        # (tracker.handover), and the others know its clock should it take some and die.
        if tick_s > 0 and now >= self._next_beacon:
            self._beacon(now)

    def _probe_partition(self, partition: int, state: PartitionState, now: float) -> None:
        """Write ``partition`` a PROBE if a deadline waits for one, or if it replays and is
        claimed, not waiting to be claimed again under a new nonce: that one is read back
        as the replay ends (:meth:`PartitionState.replay_probe_needed`). One sent before
        the claim would not cover what the last holder committed before it."""
        if state.probe_needed(now) or (
            partition not in self._reclaim
            and self._writers.get(partition) is not None
            and state.replay_probe_needed(now)
        ):
            self._send_probe(partition, [state.probe(now)], [b""])

    def _beacon(self, now: float) -> None:
        """Tell every markers partition's owner what this replica's clock reads now: should
        it take over this replica's partitions, it knows how far the two clocks are apart
        (:class:`tracker.handover.ClockBounds`) and need not start their leases afresh."""
        self._next_beacon = now + BEACON_S
        self._clocks.forget_stale(now)
        if self._owners is not None:
            self._owners.forget_stale(now)
        known = self._clocks.passed_on(now)
        sent_ms = floor_ms(now)
        # Next to each beacon, in the same record, what this replica holds: should it fall
        # silent, another can take those up (tracker.orphans). A replica before that reads
        # the second entry as a PROBE it does not know, and passes over it.
        owns = owns_text(self._nonce, self._states)
        ready = ready_text(self._nonce, self._ready())
        probe = int(MarkerType.PROBE)
        self._beacon_partitions = self._partition_count(self.config.marker_topic)
        for partition in range(self._beacon_partitions):
            text = beacon_text(self._nonce, known, sent_ms, self._acked.get(partition))
            entries: list[Entry] = [
                (probe, 0, partition, sent_ms, 0, 0, 0, len(text)),
                (probe, 0, partition, sent_ms, 0, 0, 0, len(owns)),
                (probe, 0, partition, sent_ms, 0, 0, 0, len(ready)),
            ]
            self._send_probe(partition, entries, [text, owns, ready])

    def _ready(self) -> list[int]:
        """The partitions a holder handing one over waits for this replica to name in its
        *ready* entry (:meth:`_hand_off`): held, replayed to the end, and not being handed
        over by this one. Read by the voucher's thread too: a dict copy and plain reads."""
        handing = self._handing
        return [p for p, s in list(self._states.items()) if not s.replaying and p not in handing]

    def _vouch_due(self, now: float, last: float) -> bool:
        return (
            self._beacon_partitions > 0
            and self._link.up
            and vouch_due(now, self._next_beacon, last, self._last_turn)
        )

    def _vouch(self, now: float) -> None:
        """On the voucher's thread (:mod:`tracker.vouch`), while the loop is busy: the owns
        entry of the beacon it is late with, to every markers partition, alone in a
        record. Reads only what one dict copy and plain attributes give, and writes with
        the (thread-safe) plain producer."""
        owns = owns_text(self._nonce, frozenset(self._states))  # RuntimeError: next time
        ready = ready_text(self._nonce, self._ready())
        sent_ms, probe = floor_ms(now), int(MarkerType.PROBE)
        for partition in range(self._beacon_partitions):
            entries: list[Entry] = [
                (probe, 0, partition, sent_ms, 0, 0, 0, len(owns)),
                (probe, 0, partition, sent_ms, 0, 0, 0, len(ready)),
            ]
            value = encode_entries(entries, [owns, ready])
            self._producer.send(self.config.marker_topic, value=value, partition=partition)
        self._retired["owns_vouched"] += 1

    def _peek_owns(self) -> None:
        """Where a partition's reading is held below its high watermark, read the *owns*
        entries past the hold, so that a peer's silence is judged as if it were not held
        (:mod:`tracker.peek`)."""
        peek, owners = self._peek, self._owners
        if peek is None or owners is None:
            return
        now = time.monotonic()
        held = to_peek(
            {p: stall.behind_for(now) for p, stall in self._stalls.items() if p in self._states}
        )
        positions = {p: s.position for p, s in self._states.items() if s.position is not None}
        try:
            peek.follow(held, positions)
            read = peek.read()
        except KafkaError as exc:
            self._trouble(exc, "markers partitions %s: owns entries past the hold not read",
                          sorted(held))  # fmt: skip
            return
        now = time.monotonic()
        for clock, partitions, sent_s in read:
            # Read again later by the markers reader, once the hold ends: that only says
            # again what was said, a little later.
            owners.heard(clock, partitions, sent_s, now)
        self._retired["owns_peeked"] += len(read)

    def _adopt(self) -> None:
        """Take up the markers partitions whose owner has fallen silent (see
        :mod:`tracker.orphans`), until the group's next assignment says who keeps them:
        held as those an eager rebalance keeps are, claimed (which fences the owner, should
        it wake), replayed, probed, redelivered from, never committed."""
        owners = self._owners
        if owners is None or not self._states:
            return
        orphans = owners.orphans(time.monotonic(), self._states)
        if not orphans:
            return
        log.warning(
            "markers partitions %s: no beacon of their owner read for %.1f s; taking them "
            "up until the group's next assignment",
            orphans,
            owners.silence_s,
        )
        self._retired["partitions_adopted"] += len(orphans)
        self._kept.update(orphans)
        self._tenure.held(orphans, self._kc.group_metadata().generation_id)
        self._take(orphans, adopted=True)

    def _yield_adopted(self) -> None:
        """Let go of the adopted partitions that the group, in a settled generation, gives
        to another replica which names them again (one frozen past its silence, fenced by
        the adoption, then given them back): with handoff it claims them only once this
        replica has let them go, so holding them to the next assignment would keep it
        waiting up to :data:`CLAIM_WAIT_MAX_S` and then end this one's transaction anyway.
        Only between rounds, so no transaction of this replica's is open on them; it says
        so at its next beacon, at once (:meth:`_drop`)."""
        owners = self._owners
        if not self._handoff or owners is None or not self._kept:
            return
        if self._kc.group_metadata().state is not MemberState.STABLE:
            return  # the assignment is not settled: it may give them to this replica
        topic = self.config.marker_topic
        assigned = {tp.partition for tp in self._kc.assignment() if tp.topic == topic}
        named = owners.named_elsewhere(time.monotonic())
        mine = [p for p in self._kept if p in self._states and p not in assigned]
        going = sorted(p for p in mine if p in named)
        if not going:
            return
        log.info("markers partitions %s: adopted, and named again by a live replica the "
                 "group gives them to; letting them go once it has replayed them",
                 going)  # fmt: skip
        self._retired["adopted_let_go"] += len(going)
        self._kept.difference_update(going)
        self._hand_over(going, {}, revoked=False)

    def _hand_over(
        self, partitions: list[int], since: dict[int, float], revoked: bool = True
    ) -> None:
        """The group gives ``partitions`` to another replica. Without handoff, let them go
        now. With it, go on serving those this replica can redeliver from (claimed) until
        the new holder has replayed them (:meth:`_hand_off`): it claims them only once this
        one lets go, and could redeliver nothing before its replay anyway, so letting go at
        once only left their due deliveries waiting out that replay (full chaos run 62:
        copies 13 to 16 s late, an adopter letting go as a restarted replica was given
        its partitions). ``since``: when each began to be handed over, if it did before."""
        now = time.monotonic()
        if revoked and (new := sorted(p for p in partitions if p not in since)):
            self._retired["partitions_revoked"] += len(new)
            log.info("revoked partitions %s", new)
        unclaimed = [p for p in partitions if not self._handoff or self._writers.get(p) is None]
        if unclaimed:
            self._drop(unclaimed, revoked=False)
        for partition in partitions:
            if partition not in unclaimed:
                self._handing[partition] = since.get(partition, now)

    def _hand_off(self) -> None:
        """Let go of the partitions being handed over (:meth:`_hand_over`) that a live
        replica now names as replayed in its *ready* entry (or that one of kmq before
        those names at all), or that have waited :data:`HANDOFF_MAX_S`. Only between
        rounds, so no transaction of this replica's is open on them; it says so at its next
        beacon, at once (:meth:`_drop`), and the new holder claims them then."""
        if not self._handing:
            return
        now = time.monotonic()
        ready = self._owners.ready_elsewhere(now) if self._owners is not None else set()
        going = sorted(
            p for p, since in self._handing.items()
            if p in ready or now - since >= HANDOFF_MAX_S or self._writers.get(p) is None
        )  # fmt: skip
        if not going:
            return
        late = [p for p in going if p not in ready]
        if late:
            log.warning("markers partitions %s: their new holder has not said it replayed "
                        "them within %.0f s; letting them go anyway",
                        late, HANDOFF_MAX_S)  # fmt: skip
            self._retired["handoffs_unready"] += len(late)
        self._retired["handed_off"] += len(going)
        log.info("handed off partitions %s", going)
        self._drop(going, revoked=False)

    def _send_probe(self, partition: int, entries: list[Entry], texts: list[bytes]) -> None:
        try:
            future = self._producer.send(
                self.config.marker_topic,
                value=encode_entries(entries, texts),
                partition=partition,
            )
        except KafkaError as exc:
            self._trouble(exc, "markers partition %d: probe not sent", partition)
            return
        future.add_callback(self._probe_acked, partition)

    def _probe_acked(self, partition: int, metadata: RecordMetadata) -> None:
        """On the producer's I/O thread: what the next tick of ``partition`` tells (one
        dict store, so the run loop reads either the old pair or the new one)."""
        acked = (metadata.offset, time.monotonic())
        known = self._acked.get(partition)
        if known is None or acked[0] > known[0]:
            self._acked[partition] = acked

    @staticmethod
    def _log_replay_leases(partition: int, state: PartitionState) -> None:
        """Once a partition's replay is over: how many open leases it left, and how many of
        them no tick brought forward (they run a full lease from the replay)."""
        if state.replay_leases is None:
            return
        open_leases, uncovered = state.replay_leases
        state.replay_leases = None
        if open_leases:
            log.info(
                "partition %d: replay over with %d open leases, %d taken over from ticks, "
                "%d running a full lease from the replay",
                partition, open_leases, open_leases - uncovered, uncovered,
            )  # fmt: skip

    def _redeliver(self) -> None:
        now = time.monotonic()
        if not self._pauses.caught_up.is_set():
            self._say_held(now, layouts_known=False, holding=False)
            return  # copies go where the queue's layout says: know it first
        if self._holding():
            self._say_held(now, layouts_known=True, holding=True)
            if any(state.due_deadlines(now, 1) for state in self._states.values()):
                self._retired["rebalance_held"] += 1  # a round's worth held back
            return
        budget = self.config.max_redeliveries_per_round
        self._claim_many(self._states)  # those not claimed yet
        self._say_held(now, layouts_known=True, holding=False)
        deadlines: dict[int, list[float]] = {}
        for partition, state in self._states.items():
            if partition in self._reclaim and not self._reclaimed(partition, state):
                continue
            if self._writers.get(partition) is None:
                continue  # not fenced in yet: it must not redeliver from this partition
            deadlines[partition] = state.due_deadlines(now, budget)
        due: list[Due] = []
        for partition, count in share_budget(deadlines, budget).items():
            due.extend(self._states[partition].due(now, count))
        if not due:
            return
        try:
            self._redeliver_due(due, now)
        except KafkaError:
            # Taken from their states, they are out of the deadline lists until an outcome
            # is reported: one left without would never come due again, and a marker read
            # for it meanwhile (a NACK of its copy) is passed over as late. Those with an
            # outcome already are left as they are.
            for d in due:
                self._failed(d)
            raise

    def _say_held(self, now: float, layouts_known: bool, holding: bool) -> None:
        """Log, once while it lasts, the gate a partition's leases overdue by
        :data:`tracker.holds.HELD_LOG_S` or more wait on (``leases_held``)."""
        held = self._held
        for partition, state in self._states.items():
            first = state.first_lease_deadline(now)
            overdue = None if first is None else now - first
            reason = None
            if first is not None and now - first >= held.after_s:
                reason = hold_reason(
                    layouts_known=layouts_known,
                    rebalance_holds=holding,
                    replaying=state.replaying,
                    claimed=self._writers.get(partition) is not None,
                    reclaiming=partition in self._reclaim,
                    due_by_log=first <= state.horizon,
                )
            said = held.observe(partition, overdue, reason)
            if said is not None and overdue is not None:
                self._retired["leases_held"] += 1
                log.info("markers partition %d: leases %.1f s overdue wait: %s",
                         partition, overdue, said)  # fmt: skip

    def _redeliver_due(self, due: list[Due], now: float) -> None:
        due = self._copy_unread_again(due, now)
        if not due:
            return
        began = time.monotonic()
        try:
            result = self._records.read(due)
        except KafkaError as exc:
            self._trouble(exc, "cannot re-read records to redeliver; retrying")
            for d in due:
                self._failed(d)
            return
        finally:
            self._slowest_reread_s = max(self._slowest_reread_s, time.monotonic() - began)
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
        by_partition: dict[int, list[Copy]] = {}
        for d in due:
            record = result.found.get(d.key)
            if record is not None:
                copy = copy_of(d, record)
                if not self._held_by_pause(copy, now):
                    by_partition.setdefault(d.marker_partition, []).append(copy)
        for partition, copies in by_partition.items():
            self._redeliver_partition(partition, copies)

    def _copy_unread_again(self, due: list[Due], now: float) -> list[Due]:
        """``due`` without the copies nobody took that need no second copy yet: those
        whose retry partition a live consumer reads (it is coming), or whose queue has no
        live reader elsewhere to send one to. They are looked at again later."""
        out: list[Due] = []
        for d in due:
            queue = d.unread_queue
            if not queue:
                out.append(d)
                continue
            _, partition, _ = split_key(d.key)
            live = self._live(queue, now)
            try:
                retry_window = self._partitions_of(self.config.retry_topic, queue)
                queue_window = self._partitions_of(self.config.queue_topic, queue)
            except KafkaError:
                retry_window = queue_window = ()
            # What its reader reads, and what the copy could go to instead (as
            # Redeliverer.target will choose: kmq.layout.toward_live_reader).
            held = holders_reads(queue_window, retry_window, partition, True)
            if not held & live and live - held:
                out.append(d)
                continue
            if not live:  # nobody reads the queue's retry lane: say where this copy is
                self._notices.unread(queue, partition)
            state = self._states.get(d.marker_partition)
            if state is not None:
                # A copy on a spare (outside the window) is read by the queue's group only
                # while a member is given that spare: watch it until someone takes it or it
                # can be copied toward a reader, however long the queue goes unread.
                state.keep_watching(
                    d.key,
                    now,
                    self.config.unread_copy_s,
                    until_taken=partition not in retry_window,
                )
        return out

    def _notice_unread(self) -> None:
        """Write and withdraw the control topic's ``unread`` notices (tracker.notices)."""
        now = time.monotonic()
        if not self._notices.due(now):
            return
        topic = self.config.retry_topic
        write, withdraw = self._notices.changes(
            self._pauses.table.unread_notices(topic),
            lambda queue: bool(self._live(queue, now)),
            now,
        )
        sends: list[tuple[str, int, bytes | None]] = [(q, p, UNREAD_VALUE) for q, p in write]
        sends += [(q, p, None) for q, p in withdraw]
        for queue, partition, value in sends:
            if value:
                log.info("queue %r: copies on retry partition %d, and no reader of the "
                         "queue is heard: saying so on the control topic",
                         queue, partition)  # fmt: skip
            else:
                log.info("queue %r: a reader is heard again; withdrawing the notice for "
                         "retry partition %d", queue, partition)  # fmt: skip
            self._retired["unread_notices" if value else "unread_withdrawn"] += 1
            try:
                self._producer.send(
                    self.config.control_topic,
                    key=unread_key(topic, partition, queue),
                    value=value,
                )
            except KafkaError as exc:
                self._trouble(exc, "control topic: notice not sent")

    def _reclaimed(self, partition: int, state: PartitionState) -> bool:
        """Once a partition kept through a rebalance is claimed anew (its producer was let
        go when it was assigned again, so whoever claimed it in between is fenced), act on
        none of its deadlines until a probe written after the claim is read back, so every
        redelivery committed before the claim has been read too. False: not claimed yet
        (the claim goes on, and is waited for again next round)."""
        if self._writers.get(partition) is None:
            return False
        state.regate(random.getrandbits(32))
        self._reclaim.discard(partition)
        # Now, not at the next turn's _probe (a second later on a busy replica): every
        # overdue lease of the partition waits for it.
        self._probe_partition(partition, state, time.monotonic())
        return True

    def _holding(self) -> bool:
        """Whether redelivery waits, because another replica may be claiming these
        partitions right now (the reason is in :meth:`_on_revoked`): the group has dropped
        this replica (a heartbeat or commit was told its member id or generation is gone),
        or an eager rebalance is under way (seen by the loop, or so far only by
        kafka-python, whose IO thread runs the rebalance while a round goes on). With
        beacons on, a replica given a partition claims it only once this one has let it
        go (:meth:`_claim_many`), so a rebalance holds nothing back until it has lasted
        :data:`KEEP_THROUGH_REBALANCE_S`."""
        state = self._kc.group_metadata().state
        if state is MemberState.UNJOINED:
            return True
        eager = self.config.rebalance != COOPERATIVE
        if not (self._rebalancing or (eager and state is MemberState.REBALANCING)):
            self._rebalance_began = None
            return False
        now = time.monotonic()
        if self._rebalance_began is None:
            self._rebalance_began = now
        return not self._handoff or now - self._rebalance_began >= KEEP_THROUGH_REBALANCE_S

    def _claim_many(self, partitions: Iterable[int]) -> None:
        """Claim those of ``partitions`` not claimed yet that no live replica still holds.

        A claim ends the previous holder's open transaction, and on the embedded broker one
        that lands while the holder commits it holds the partition's readers for good
        (``bench.broker_txn_race``). So with beacons on, a replica given a partition claims
        it only once no other live replica names it in its newest owns entry (it names
        what it holds until it drops it, between transactions), or after
        :data:`CLAIM_WAIT_MAX_S`; a partition whose claim waited acts on none of its
        deadlines until a probe written after the claim is read back (:meth:`_reclaimed`),
        so every redelivery the holder committed before letting go has been read."""
        todo = [p for p in partitions if self._writers.get(p) is None]
        if not todo:
            return
        if not self._handoff or self._owners is None:
            self._writers.claim_many(todo)
            return
        now, owners, ready = time.monotonic(), self._owners, []
        for partition in todo:
            since = self._claim_wanted.get(partition)
            if owners.clear_to_claim(partition, now):
                ready.append(partition)
            elif since is None:
                self._claim_wanted[partition] = now
                self._reclaim.add(partition)
                self._retired["claim_waits"] += 1
            elif now - since >= CLAIM_WAIT_MAX_S:
                log.warning("markers partition %d: still named by another replica after "
                            "%.0f s; claiming it anyway", partition, now - since)  # fmt: skip
                ready.append(partition)
        for partition in self._writers.claim_many(ready):
            self._claim_wanted.pop(partition, None)

    def _owned_now(self, partition: int) -> bool:
        """Whether the group gives this replica ``partition`` in a settled generation, so
        an offset commit for it can be accepted (partitions kept through a rebalance are
        not)."""
        if self._kc.group_metadata().state != MemberState.STABLE:
            return False
        return TopicPartition(self.config.marker_topic, partition) in self._kc.assignment()

    def _redeliver_partition(self, partition: int, copies: list[Copy]) -> None:
        """One transaction: the copies, their markers, and the commit that skips them."""
        state = self._states.get(partition)
        txn = self._writers.get(partition)
        if state is None or txn is None:
            return
        if self._holding():  # it began after this round's start: the copies wait
            self._retired["rebalance_held"] += 1
            for copy in copies:
                self._failed(copy.due)
            return
        offset = state.commit_offset(c.due.start_offset for c in copies)
        if not self._owned_now(partition):
            offset = None  # committed later, once the group has settled
        tp = TopicPartition(self.config.marker_topic, partition)
        offsets = {tp: OffsetAndMetadata(offset, "", -1)} if offset is not None else {}
        began = time.monotonic()
        try:
            outcome = self._redeliverer.round(
                txn, copies, offsets, self._kc.group_metadata(), self._copies
            )
        except KafkaError as exc:  # the layout could not be read, say
            self._trouble(exc, "markers partition %d: redelivery not started", partition)
            outcome = RoundOutcome(False)
        self._slowest_txn_s = max(self._slowest_txn_s, time.monotonic() - began)
        if outcome.fenced:
            self._fenced(partition)
            return
        if outcome.stuck:
            # Its next round claims the partition again with a new producer, which fences
            # this one and ends its transaction at the broker.
            self._writers.release(partition, timeout_s=0.0)
        if not outcome.written:
            for copy in copies:
                self._failed(copy.due)
            return
        if offset is not None:
            self._committed[partition] = offset
        if outcome.written_again:
            self._retired["copies_written_again"] += outcome.written_again
        placed = outcome.placed or (None,) * len(copies)
        for copy, where in zip(copies, placed, strict=True):
            self._done(copy, where)

    def _fenced(self, partition: int) -> None:
        """Another replica claimed the partition since this one did: this one is a zombie
        for it (frozen past its session, most likely). Drop it, and watch whether the group
        gives it back (:meth:`_retake_fenced`)."""
        log.warning(
            "markers partition %d: fenced by a newer owner; dropping it without redelivering",
            partition,
        )
        state = self._states.pop(partition, None)
        if state is not None:
            state.stats["fenced"] += 1
            self._retired.update(state.stats)
        self._writers.release(partition)
        self._committed.pop(partition, None)
        self._fresh.discard(partition)
        self._kept.discard(partition)
        self._reclaim.discard(partition)
        self._claim_wanted.pop(partition, None)
        self._handing.pop(partition, None)
        self._tenure.forget(partition)
        self._fence_watch.fenced(
            partition, self._kc.group_metadata().generation_id, time.monotonic()
        )

    def _retake_fenced(self) -> None:
        """Take up again the fenced partitions the group has since given back to this
        replica without saying so (see :class:`tracker.fencing.FenceWatch`)."""
        if not self._fence_watch.watching():
            return
        meta = self._kc.group_metadata()
        topic = self.config.marker_topic
        assigned = {tp.partition for tp in self._kc.assignment() if tp.topic == topic}
        now = time.monotonic()
        back = self._fence_watch.retake(
            assigned,
            meta.generation_id,
            meta.state == MemberState.STABLE and self._link.up,
            now,
            frozenset() if self._owners is None else self._owners.held_elsewhere(now),
        )
        if not back:
            return
        log.warning(
            "markers partitions %s: still this replica's in generation %d after a fence; "
            "taking them up again",
            back,
            meta.generation_id,
        )
        self._retired["partitions_retaken"] += len(back)
        self._tenure.held(back, meta.generation_id)
        # Its records may have been read and skipped while it was dropped: _take has the
        # markers reader start again where the new state starts.
        self._take(back)

    def _live(self, queue: str, now: float, within_s: float | None = None) -> frozenset[int]:
        """The retry-topic partitions some consumer of ``queue`` said it reads lately (within
        ``within_s``, if given; :class:`tracker.readers.LiveReaders`), of those the topic
        has."""
        live = self._readers.live(queue, now, within_s)
        if not live:
            return live
        try:
            count = self._partition_count(self.config.retry_topic)
        except KafkaError:  # metadata not cached, and Kafka not reachable: as they said
            return live
        return frozenset(p for p in live if p < count)

    def _partition_count(self, topic: str) -> int:
        return len(self._reader.partitions_for_topic(topic) or ())

    def _partitions_of(self, topic: str, queue: str) -> tuple[int, ...]:
        """Where ``queue``'s records go on ``topic``: its layout there."""
        actual = self._partition_count(topic)
        if not actual:
            raise KafkaError(f"topic {topic} has no partitions")
        return write_partitions(self._pauses.table.layout(topic), queue, actual)

    def _done(self, copy: Copy, placed: tuple[int, int] | None = None) -> None:
        if copy.dead_letter_queue:
            log.info(
                "dead-lettered %s (queue %r -> %r after %d attempts, %s)",
                copy.message_id, copy.queue, copy.dead_letter_queue,
                copy.attempt, copy.due.reason,
            )  # fmt: skip
        elif placed is None:
            log.info(
                "redelivered %s (queue %r, attempt %d, %s)",
                copy.message_id, copy.queue, copy.attempt, copy.due.reason,
            )  # fmt: skip
        else:
            # Where it went and who was heard reading the queue's retry lane then: what a
            # copy that waited long for a reader is looked into with.
            live = self._live(copy.destination, time.monotonic())
            log.info(
                "redelivered %s (queue %r, attempt %d, %s) to %s:%d; readers heard: %s",
                copy.message_id, copy.queue, copy.attempt, copy.due.reason,
                self.config.retry_topic, placed[0], _listed(live),
            )  # fmt: skip
            if not live:
                self._notices.unread(copy.destination, placed[0])
        owner = self._states.get(copy.due.marker_partition)
        if owner is not None:
            owner.redelivered(
                copy.due.key,
                dead_lettered=bool(copy.dead_letter_queue),
                copy=None if placed is None else delivery_key(RETRY_LANE, *placed),
                queue=copy.destination,
                now=time.monotonic(),
                unread_s=self.config.unread_copy_s,
            )

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
        if partitions is None:
            partitions = [p for p in self._states if self._owned_now(p)]
        for partition in partitions:
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
            self._trouble(exc, "offset commit failed; the next owner replays a little more")
            return
        for tp, meta in offsets.items():
            self._committed[tp.partition] = meta.offset

    def _log_stats(self) -> None:
        now = time.monotonic()
        if now < self._next_stats:
            return
        self._next_stats = now + self.config.stats_interval_s
        stats = self.stats()
        # The slowest loop turn, and the slowest redelivery step, since the last stats line:
        # while a turn lasts, nothing else is read or redelivered. Of a redelivery step: the
        # slowest re-read of its records, and the slowest one partition's transaction.
        stats["turn_max_ms"] = round(self._slowest_turn_s * 1000)
        stats["redeliver_max_ms"] = round(self._slowest_redelivery_s * 1000)
        stats["reread_max_ms"] = round(self._slowest_reread_s * 1000)
        stats["txn_max_ms"] = round(self._slowest_txn_s * 1000)
        # Of reading: the longest the reader returned no marker at all, and the longest one
        # partition stood still below the high watermark its fetches reported. A long first
        # with a short second: no fetch answers came (the high watermark went stale); with
        # a long second too: the broker had records it did not return (an open transaction
        # holding the last stable offset, or a broker too slow to reach them in its wait).
        stats["read_gap_max_ms"] = round(self._longest_read_gap_s * 1000)
        stats["behind_max_ms"] = round(self._slowest_behind_s * 1000)
        self._slowest_turn_s = self._slowest_redelivery_s = 0.0
        self._slowest_reread_s = self._slowest_txn_s = 0.0
        self._slowest_behind_s = self._longest_read_gap_s = 0.0
        log.info("stats: %s", " ".join(f"{k}={v}" for k, v in sorted(stats.items())))

    def _shutdown(self) -> None:
        try:
            self._commit(force=True)
        finally:
            try:
                self._kc.close(autocommit=False)
                self._offsets.close(autocommit=False)
                self._mc.close()
                if self._peek is not None:
                    self._peek.close()
                self._reader.close()
                self._pauses.close()
            finally:
                # Records still unanswered (Kafka gone) must not skip the closes after.
                kafka_clients.close_producer(self._producer, 5)
                kafka_clients.close_producer(self._copies, 5)
                self._writers.close()
        log.info("stopped: %s", " ".join(f"{k}={v}" for k, v in sorted(self.stats().items())))

    # -- rebalance --------------------------------------------------------------------

    def _rebalanced(self) -> None:
        """Apply the rebalances the listener saw, in order, on the run loop's thread."""
        for assigned, partitions, generation in self._listener.take():
            if assigned:
                self._on_assigned(partitions, generation)
            else:
                self._on_revoked(partitions)

    def _on_revoked(self, revoked: list[int]) -> None:
        partitions = [p for p in revoked if p in self._states]
        if not partitions:
            return
        # May fail (the group has moved on): the next owner then replays a little more.
        self._commit(force=True, partitions=partitions)
        if self.config.rebalance != COOPERATIVE:
            # Eager: every replica gives up everything at every rebalance, to get most of
            # it back. Until the assignment says, go on reading. Without handoff, redeliver
            # nothing: a replica given one of these claims it as soon as its assignment
            # arrives, which may be before this one's, and on the embedded broker a claim
            # that ends a transaction while its holder commits it holds the partition's
            # readers for good (bench.broker_txn_race; chaos runs 37, 38, 43, 53). With
            # handoff, that claim waits for this replica to let go (_holding, _claim_many).
            # Adopted partitions are kept the same way.
            self._kept.update(partitions)
            self._rebalancing = True
            log.info("rebalancing: keeping partitions %s until the next assignment, %s",
                     sorted(partitions),
                     "redelivering from them meanwhile" if self._handoff
                     else "redelivering nothing meanwhile")  # fmt: skip
            return
        self._hand_over(partitions, {})

    def _drop(self, partitions: list[int], revoked: bool = True) -> None:
        for partition in partitions:
            self._fresh.discard(partition)
            self._reclaim.discard(partition)
            self._tenure.forget(partition)
            self._stalls.pop(partition, None)
            self._held.forget(partition)  # taken again, a hold is news again
            state = self._states.pop(partition)
            self._retired.update(state.stats)
            self._committed.pop(partition, None)
            self._writers.release(partition)
            self._claim_wanted.pop(partition, None)
            self._handing.pop(partition, None)
        self._caught_up.clear()
        self._next_beacon = 0.0  # say at once that they are let go (_claim_many)
        if revoked:
            self._retired["partitions_revoked"] += len(partitions)
            log.info("revoked partitions %s", sorted(partitions))

    def _on_assigned(self, assigned: list[int], generation: int | None = None) -> None:
        """``assigned``: the whole assignment (eager), or what it gained (cooperative), in
        ``generation`` (None: not known)."""
        self._assignment_known = True
        self._rebalancing = False
        self._rebalance_began = None
        self._retired["assignments"] += 1
        kept, self._kept = self._kept, set()
        handing, self._handing = self._handing, {}
        kept |= set(handing)  # assigned here again, or still handed over
        gone = sorted(p for p in kept - set(assigned) if p in self._states)
        if gone:
            self._hand_over(gone, handing)
        again = kept & set(assigned) & set(self._states)
        unbroken = self._tenure.unbroken(again, generation)
        if unbroken and generation is not None:
            log.info("kept partitions %s were this replica's in generation %d, the one "
                     "before: their claims stand", sorted(unbroken), generation - 1)  # fmt: skip
        again -= unbroken
        for partition in again:  # claimed anew before its next redelivery (_reclaimed)
            self._writers.release(partition, timeout_s=0.0)
        self._reclaim |= again
        if generation is not None:
            self._tenure.held(assigned, generation)
        self._take(assigned)
        if self._owners is not None:
            self._owners.reassigned(time.monotonic(), self._states)

    def _take(self, partitions: list[int], adopted: bool = False) -> None:
        """Track ``partitions`` (those tracked already stay as they are); ``adopted``: from
        a silent owner, not assigned by the group."""
        new = []
        for partition in partitions:
            self._fence_watch.forget(partition)
            if partition not in self._states:
                new.append(partition)
        # Claim them before anything else, with the kept ones to claim again (_on_assigned):
        # from here on a previous owner's redeliveries from them are refused (a claim not
        # answered now is waited for again before this replica's first redelivery from it).
        began = time.monotonic()
        self._claim_many(partitions)  # those not claimed yet
        claimed = time.monotonic()
        for partition in new:
            state = self._states[partition] = PartitionState(
                partition,
                default_lease_s=self.config.default_redelivery_timeout_s,
                probe_nonce=self._nonce,
                clocks=self._clocks,
                owners=self._owners,
                unread_s=self.config.unread_copy_s,
            )
            # Replay exactly from the committed offset, whatever was fetched before.
            committed = self._offsets.committed(
                TopicPartition(self.config.marker_topic, partition)
            )
            if committed is not None:
                state.set_position(committed)
            self._fresh.add(partition)
            self._seek.add(partition)
        self._caught_up.clear()
        self._next_beacon = 0.0  # say so at once: others adopt what nobody names
        # How long the claims and the committed offsets (one blocking request each) held
        # the loop: what a take-over waits on before its replay can begin.
        looked_up = time.monotonic()
        took = f"(claims {claimed - began:.1f} s, committed offsets {looked_up - claimed:.1f} s)"
        if adopted:
            log.info("adopted partitions %s; now tracking %s %s",
                     sorted(new), self.partitions(), took)  # fmt: skip
        else:
            log.info("assigned partitions %s %s", self.partitions(), took)


def _listed(partitions: Iterable[int]) -> str:
    return ",".join(map(str, sorted(partitions))) or "none"


def _cause(exc: KafkaError) -> str:
    text = str(exc)
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Only records what happened, with the generation an assignment came in. kafka-python 3
    calls it on its IO thread, where neither a blocking commit nor touching the tracker's
    state (owned by the run loop) is safe."""

    def __init__(self, generation: Callable[[], int]) -> None:
        self._lock = threading.Lock()
        self._generation = generation
        self._events: list[tuple[bool, list[int], int | None]] = []

    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        with self._lock:
            self._events.append((False, [tp.partition for tp in revoked], None))

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        # Called once the join is complete, its generation already this member's.
        generation = self._generation()
        with self._lock:
            self._events.append((True, [tp.partition for tp in assigned], generation))

    def take(self) -> list[tuple[bool, list[int], int | None]]:
        with self._lock:
            events, self._events = self._events, []
        return events
