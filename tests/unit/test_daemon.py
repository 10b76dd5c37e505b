"""The tracker's decisions around fencing and rebalances (tracker.daemon.Tracker), with stubs
for Kafka.

The Tracker constructor connects to Kafka, so these tests build one with ``__new__`` and set
only what ``_redeliver``, ``_redeliver_partition``, ``_fenced`` and the rebalance handlers
use: the states, a real PartitionWriters over stub transactional producers, a real
Redeliverer, and stubs for the group consumer and markers reader (one object), the record
reader and the pause table."""

from __future__ import annotations

import dataclasses
import logging
import re
import socket
import threading
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import (
    InvalidProducerEpochError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
)
from kafka.structs import ConsumerGroupMetadata, MemberState

from kmq import kafka_clients
from kmq.control import UNREAD_VALUE, ControlTable, unread_key
from kmq.errors import BrokerError
from kmq.markers import QUEUE_LANE, RETRY_LANE, MarkerType, decode, encode_entries, parse
from kmq.records import delivery_key, queue_headers
from kmq.txn_wait import TransactionStuck
from tests.unit.kafka_stubs import StubTxnProducer
from tests.unit.test_state import marker
from tracker.config import TrackerConfig
from tracker.daemon import (
    CLAIM_WAIT_MAX_S,
    HANDOFF_MAX_S,
    KEEP_THROUGH_REBALANCE_S,
    Tracker,
    _Listener,
    markers_wait_ms,
)
from tracker.dating import WriteDates
from tracker.fencing import FenceWatch, PartitionWriters, Tenure, transactional_id
from tracker.handover import BEACON_S, ClockBounds, parse_beacon, parse_tick
from tracker.health import BrokerLink
from tracker.holds import HeldLeases
from tracker.notices import UnreadNotices
from tracker.orphans import OwnerWatch, owns_text, parse_owns, parse_ready
from tracker.peek import HELD_S, OwnsPeek
from tracker.readers import LiveReaders
from tracker.redeliver import Redeliverer, copy_of
from tracker.reread import ReadResult, Record
from tracker.state import Due, PartitionState, floor_ms
from tracker.vouch import VOUCH_TURN_S

CONFIG = TrackerConfig(
    "localhost:9092",
    queue_topic="q.topic",
    marker_topic="q.markers",
    retry_topic="q.topic.retry",
    group_id="grp",
    redelivery_retry_s=7.0,
)
LEASE_MS = 1000
GROUP_METADATA = ConsumerGroupMetadata("grp", 5, "member-1", None, MemberState.STABLE)


class StubGroupConsumer:
    """The group consumer: its membership, assignment, committed offsets and seeks."""

    def __init__(self) -> None:
        self.metadata = GROUP_METADATA
        self.assigned: set[int] = set()
        self.committed_at: dict[int, int] = {}
        self.seeks: list[tuple[int, int | None]] = []
        self.reading: set[int] = set()
        self.commits: list[dict[int, int]] = []
        self.paused_tps: set[TopicPartition] = set()
        self.positions: dict[int, int] = {}
        self.highwaters: dict[int, int] = {}

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self.metadata

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(CONFIG.marker_topic, p) for p in self.assigned}

    def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_at.get(tp.partition)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp.partition, offset))

    def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.partition, None))

    def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append({tp.partition: meta.offset for tp, meta in offsets.items()})

    # The markers reader (the same stub): what it reads, and the group member's pauses.
    def assign(self, tps: list[TopicPartition]) -> None:
        self.reading = {tp.partition for tp in tps}

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_tps)

    def position(self, tp: TopicPartition) -> int:
        return self.positions[tp.partition]

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp.partition)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_tps |= set(tps)


class StubPauses:
    def __init__(self) -> None:
        self.caught_up = threading.Event()
        self.caught_up.set()
        self.table = ControlTable()

    def paused_until_ms(self, queue: str) -> int:
        return 0


class StubRecords:
    """The record reader: every due delivery's record is found, unless listed in ``gone``."""

    def __init__(self) -> None:
        self.asked: list[list[Due]] = []
        self.gone: set[int] = set()

    def read(self, due: list[Due]) -> ReadResult:
        self.asked.append(list(due))
        result = ReadResult()
        for d in due:
            if d.key in self.gone:
                result.gone.append(d)
                continue
            _, partition, offset = d.delivery
            headers = tuple(queue_headers(f"m-{partition}-{offset}", 1, ()))
            result.found[d.key] = Record(partition, offset, b"orders", b"payload", headers)
        return result


class Producers:
    """Builds the stub transactional producer of each markers partition; ``fail[p]`` says
    what the methods of partition ``p``'s producers raise."""

    def __init__(self) -> None:
        self.made: dict[int, list[StubTxnProducer]] = {}
        self.fail: dict[int, dict[str, BaseException]] = {}

    def __call__(self, txn_id: str) -> StubTxnProducer:
        partition = int(txn_id.rsplit(".", 1)[1])
        producer = StubTxnProducer(txn_id, fail=self.fail.get(partition, {}))
        self.made.setdefault(partition, []).append(producer)
        return producer

    def last(self, partition: int) -> StubTxnProducer:
        return self.made[partition][-1]


def delivery(partition: int) -> int:
    """The delivery key of the one message started on markers partition ``partition``."""
    return delivery_key(QUEUE_LANE, 3, 100 + partition)


def expired_state(partition: int) -> PartitionState:
    """A caught-up state whose one delivery's lease ran out long ago (no probes: due by
    the clock alone)."""
    state = PartitionState(partition)
    state.set_position(10)
    state.set_end_offset(10)
    start = (int(MarkerType.START), QUEUE_LANE, 3, 100 + partition, 1, LEASE_MS, 0, 0)
    state.on_record(10, encode_entries([start], []), time.monotonic() - 60)
    return state


class Harness:
    def __init__(self, partitions: tuple[int, ...] = (0, 1), handoff: bool = False) -> None:
        """``handoff``: claims wait for the holder to let go, and rebalances hold nothing
        back at first (beacons on, as deployed); off, as with beacons off."""
        self.producers = Producers()
        self.records = StubRecords()
        self.claim_waits: list[tuple[str, float]] = []
        """Every claim's (transactional id, how long it may wait), in order."""
        self.writers = PartitionWriters(
            self.producers, CONFIG.group_id, CONFIG.marker_topic, init=self._init
        )
        t = Tracker.__new__(Tracker)
        t.config = CONFIG
        t._states = {p: expired_state(p) for p in partitions}
        t._retired = Counter()
        t._committed = {p: 5 for p in partitions}
        t._fresh = set()
        t._writers = self.writers
        self.group = t._kc = t._mc = t._offsets = StubGroupConsumer()
        self.group.assigned = set(partitions)
        t._kept = set()
        t._rebalancing = False
        t._rebalance_began = None
        t._claim_wanted = {}
        t._handing = {}
        t._handoff = handoff
        t._reclaim = set()
        t._reading = set(partitions)
        t._seek = set()
        t._fence_watch = FenceWatch()
        t._tenure = Tenure()
        t._stalls = {}
        t._notices = UnreadNotices()
        t._caught_up = threading.Event()
        t._nonce = 7
        t._clocks = ClockBounds(t._nonce)
        t._owners = OwnerWatch(t._nonce, CONFIG.adopt_after_s)
        t._link = BrokerLink(CONFIG.bootstrap_servers, 3.0)
        t._link.connected(0.0)
        t._next_beacon = 0.0
        t._slowest_reread_s = t._slowest_txn_s = 0.0
        t._slowest_behind_s = t._longest_read_gap_s = t._last_read = 0.0
        t._peek = None
        t._topics = {0: CONFIG.queue_topic, 1: CONFIG.retry_topic}
        t._redeliverer = Redeliverer(
            CONFIG.queue_topic,
            CONFIG.retry_topic,
            CONFIG.marker_topic,
            lambda t, q: (0, 1),
            live=lambda queue: t._live(queue, time.monotonic()),
        )
        t._readers = LiveReaders()
        t._dates = WriteDates(t._readers.fresh_s)
        t._held = HeldLeases()
        raw: Any = t  # typed as the real ControlWatcher and RecordReader
        self.copies = raw._copies = StubTxnProducer("copies")  # sends only: no transaction
        self.plain = raw._producer = StubTxnProducer("plain")  # probes, beacons: no transaction
        t._acked = {}
        raw._pauses = StubPauses()
        raw._records = self.records
        raw._partitions_of = lambda topic, queue: (0, 1)  # every queue's window
        raw._partition_count = lambda topic: 4
        self.tracker = t
        self.states = dict(t._states)

    def _init(self, producer: StubTxnProducer, wait_s: float) -> None:
        self.claim_waits.append((producer.transactional_id, wait_s))
        producer.init_transactions()

    def claim(self, *partitions: int) -> None:
        for p in partitions:
            assert self.writers.claim(p)


@pytest.mark.parametrize(
    "fail",
    [
        {"commit_transaction": ProducerFencedError()},
        {"begin_transaction": ProducerFencedError()},
        {"send_offsets_to_transaction": InvalidProducerEpochError()},
        {"commit_transaction": InvalidProducerEpochError()},
        # kafka-python 3.0.12, its producer fenced on its I/O thread before this round:
        {
            "begin_transaction": KafkaError(
                "Cannot execute transactional method because we are in an error state: "
                f"{ProducerFencedError()}"
            )
        },
    ],
    ids=[
        "fenced-at-commit",
        "fenced-at-begin",
        "epoch-at-offsets",
        "epoch-at-commit",
        "fenced-in-an-error-state",
    ],
)
def test_a_fenced_round_drops_the_partition_without_redelivering(
    fail: dict[str, BaseException],
) -> None:
    h = Harness()
    h.producers.fail[1] = fail
    h.claim(0, 1)
    h.tracker._fresh.add(1)
    fenced_txn = h.writers.get(1)
    h.tracker._redeliver()

    t = h.tracker
    assert t.partitions() == [0], "the fenced partition's state is dropped"
    assert h.writers.claimed() == {0} and h.writers.get(1) is None, "its writer released"
    assert h.producers.last(1) is fenced_txn and fenced_txn.closed_with == [5.0]
    assert 1 not in t._committed and 1 not in t._fresh
    fenced = h.states[1]
    assert fenced.stats["fenced"] == 1
    assert fenced.stats["redeliveries"] == fenced.stats["redelivery_failed"] == 0
    assert fenced.in_flight == 1, "nothing was recorded as redelivered"
    assert t._retired["fenced"] == 1 and t._retired["start"] == 1
    stats = t.stats()
    assert (stats["fenced"], stats["redeliveries"], stats["in_flight"]) == (1, 1, 0)
    # The other partition's round went through on its own producer.
    assert h.states[0].in_flight == 0 and t._committed[0] == 11
    assert h.producers.last(0).calls[-1] == "commit_transaction"


def test_a_fenced_partition_is_forgotten_even_if_its_producer_will_not_close() -> None:
    h = Harness(partitions=(2,))
    h.producers.fail[2] = {"commit_transaction": ProducerFencedError(), "close": KafkaError()}
    h.claim(2)
    h.tracker._redeliver()
    assert h.tracker.partitions() == [] and h.writers.claimed() == set()
    assert h.tracker.stats()["fenced"] == 1


def test_fenced_counts_add_up_over_partitions() -> None:
    h = Harness(partitions=(0, 1, 2))
    for p in (0, 2):
        h.producers.fail[p] = {"commit_transaction": ProducerFencedError()}
    h.claim(0, 1, 2)
    h.tracker._redeliver()
    assert h.tracker.partitions() == [1]
    assert h.tracker.stats()["fenced"] == 2 and h.tracker.stats()["redeliveries"] == 1


def test_a_failed_round_keeps_the_partition_and_retries() -> None:
    h = Harness(partitions=(0,))
    h.producers.fail[0] = {"commit_transaction": KafkaTimeoutError("slow")}
    h.claim(0)
    before = time.monotonic()
    h.tracker._redeliver()
    state = h.states[0]
    assert h.tracker.partitions() == [0] and h.writers.claimed() == {0}
    txn = h.producers.last(0)
    assert txn.calls[-1] == "abort_transaction" and txn.closed_with == []
    assert state.stats["redelivery_failed"] == 1 and state.stats["fenced"] == 0
    assert state.in_flight == 1
    deadline = state.next_deadline()
    assert deadline is not None and deadline >= before + CONFIG.redelivery_retry_s
    assert h.tracker._committed[0] == 5, "no commit for a round that did not happen"


def test_a_stuck_round_drops_its_producer_and_the_partition_is_claimed_again() -> None:
    h = Harness(partitions=(0,))
    h.producers.fail[0] = {"commit_transaction": TransactionStuck("no answer")}
    h.claim(0)
    stuck = h.producers.last(0)
    h.tracker._redeliver()
    state = h.states[0]
    assert h.tracker.partitions() == [0], "the partition is still ours"
    assert h.writers.claimed() == set() and stuck.closed_with == [0.0]
    assert state.stats["redelivery_failed"] == 1 and state.stats["fenced"] == 0
    assert state.in_flight == 1 and h.tracker._committed[0] == 5
    h.producers.fail[0] = {}
    h.claim(0)
    assert h.producers.last(0) is not stuck, "a new producer claims the transactional id"


def test_a_written_round_redelivers_and_records_the_commit() -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    h.tracker._redeliver()
    state, txn = h.states[0], h.producers.last(0)
    assert state.in_flight == 0 and state.stats["redeliveries"] == 1
    assert h.tracker._committed[0] == 11, "past the START the round settled"
    [(offsets, metadata)] = txn.offsets
    assert metadata is GROUP_METADATA
    assert {tp: m.offset for tp, m in offsets.items()} == {TopicPartition("q.markers", 0): 11}
    [fence, written] = txn.sent  # the transaction holds the fence check and the marker only
    assert decode(fence.value).type is MarkerType.PROBE
    marker = decode(written.value)
    assert marker.type is MarkerType.REDELIVERED and (marker.partition, marker.offset) == (3, 100)
    assert [s.topic for s in h.copies.sent] == [CONFIG.retry_topic], "the copy, outside it"
    assert h.copies.calls[-1] == "flush", "the copy is on the broker before the round ends"


def test_redeliver_takes_nothing_from_a_partition_it_cannot_claim() -> None:
    h = Harness()
    h.producers.fail[1] = {"init_transactions": KafkaTimeoutError("no coordinator")}
    deadline = h.states[1].next_deadline()
    h.tracker._redeliver()
    [asked] = h.records.asked
    assert [d.marker_partition for d in asked] == [0], "only the claimed partition's"
    assert h.writers.claimed() == {0}
    unclaimed = h.states[1]
    assert unclaimed.in_flight == 1 and unclaimed.next_deadline() == deadline, "not taken"
    assert unclaimed.stats["redelivery_failed"] == unclaimed.stats["redeliveries"] == 0
    # Not answered in time: kept, so the next claim waits on for the same request.
    assert h.producers.last(1).closed_with == [] and h.producers.last(1).sent == []
    assert h.states[0].stats["redeliveries"] == 1

    # Once the broker answers (the kept producer's request), the claim succeeds and the
    # delivery goes out.
    h.producers.fail.pop(1).clear()
    h.tracker._redeliver()
    assert h.writers.claimed() == {0, 1}
    assert [d.delivery for d in h.records.asked[1]] == [(0, 3, 101)]
    assert unclaimed.in_flight == 0 and unclaimed.stats["redeliveries"] == 1


def test_no_claim_no_reading_at_all() -> None:
    h = Harness()
    for p in (0, 1):
        h.producers.fail[p] = {"init_transactions": KafkaTimeoutError("x")}
    h.tracker._redeliver()
    assert h.records.asked == [] and h.writers.claimed() == set()
    assert all(s.in_flight == 1 and s.next_deadline() is not None for s in h.states.values())


def test_redeliver_partition_without_a_writer_does_nothing() -> None:
    h = Harness(partitions=(0,))
    [due] = h.states[0].due(time.monotonic())
    record = StubRecords().read([due]).found[due.key]
    h.tracker._redeliver_partition(0, [copy_of(due, record)])
    assert h.tracker.partitions() == [0] and h.states[0].stats["fenced"] == 0
    assert h.producers.made == {}


def test_a_round_that_cannot_start_is_a_failure_not_a_fence() -> None:
    h = Harness(partitions=(0,))

    def no_layout(topic: str, queue: str) -> tuple[int, ...]:
        raise KafkaError(f"topic {topic} has no partitions")

    h.tracker._redeliverer = Redeliverer("q.topic", "q.topic.retry", "q.markers", no_layout)
    h.claim(0)
    h.tracker._redeliver()
    state = h.states[0]
    assert h.tracker.partitions() == [0] and state.stats["fenced"] == 0
    assert state.stats["redelivery_failed"] == 1 and state.in_flight == 1


def test_fenced_on_an_unknown_partition_is_harmless() -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    h.tracker._fenced(9)
    assert h.tracker.partitions() == [0] and h.writers.claimed() == {0}
    assert h.tracker._retired == Counter()


def test_a_fenced_partition_the_group_gives_back_is_taken_up_again() -> None:
    """Under cooperative rebalancing nobody says "assigned" for a partition a member keeps:
    a replica fenced by a claim the group then undid must take the partition up itself,
    re-claiming it and reading its markers again from the committed offset."""
    h = Harness(partitions=(0, 1))
    h.producers.fail[1] = {"commit_transaction": ProducerFencedError()}
    h.claim(0, 1)
    h.group.assigned = {0, 1}
    t = h.tracker
    t._redeliver()
    assert t.partitions() == [0]
    h.producers.fail[1] = {}
    h.group.committed_at[1] = 11

    t._retake_fenced()  # the generation of the fence: maybe the claim was right
    assert t.partitions() == [0] and h.group.seeks == []
    h.group.metadata = GROUP_METADATA._replace(generation_id=6)
    t._retake_fenced()  # seen once
    assert t.partitions() == [0]
    t._retake_fenced()
    assert t.partitions() == [0, 1]
    assert h.writers.get(1) is h.producers.last(1) and len(h.producers.made[1]) == 2
    t._follow_states()
    assert h.group.seeks == [(1, 11)] and t._states[1].position == 11
    assert t.stats()["partitions_retaken"] == 1 and t.stats()["fenced"] == 1


def test_a_fenced_partition_an_adopter_holds_is_left_to_it_until_it_falls_silent() -> None:
    """Fenced in the same generation by a replica that adopted the partition while this one
    was cut off: that replica holds it and says so in its beacons, so this one does not
    take it back (which would fence the adopter and replay the partition a third time)
    until those beacons stop."""
    h = Harness(partitions=(0, 1))
    t = h.tracker
    t._fence_watch = FenceWatch(settle_s=0.0)
    h.producers.fail[1] = {"commit_transaction": ProducerFencedError()}
    h.claim(0, 1)
    t._redeliver()
    assert t.partitions() == [0]
    h.producers.fail[1] = {}
    owners = t._owners
    assert owners is not None
    base = time.monotonic()
    owners.heard(99, frozenset({1}), base, base)  # the adopter, read on partition 0
    owners.heard(t._nonce, frozenset({0}), base + 0.1, base + 0.1)
    for _ in range(3):
        t._retake_fenced()
    assert t.partitions() == [0], "left to the live adopter"
    owners.heard(t._nonce, frozenset({0}), base + 10, base + 10)  # nothing of 99 since
    t._retake_fenced()
    assert t.partitions() == [0, 1]
    assert t.stats()["partitions_retaken"] == 1


def test_a_fenced_partition_the_group_moves_away_is_not_taken_up() -> None:
    h = Harness(partitions=(0,))
    h.producers.fail[0] = {"commit_transaction": ProducerFencedError()}
    h.claim(0)
    h.group.assigned = {0}
    h.tracker._redeliver()
    h.producers.fail[0] = {}
    h.group.assigned = set()  # revoked in the next generation
    h.group.metadata = GROUP_METADATA._replace(generation_id=6)
    for _ in range(3):
        h.tracker._retake_fenced()
    h.group.assigned = {0}  # and back later: the listener's assignment will say so
    h.group.metadata = GROUP_METADATA._replace(generation_id=7)
    for _ in range(3):
        h.tracker._retake_fenced()
    assert h.tracker.partitions() == [] and h.group.seeks == []
    assert len(h.producers.made[0]) == 1, "never claimed again"


REBALANCING = GROUP_METADATA._replace(generation_id=-1, state=MemberState.REBALANCING)


def test_an_eager_rebalance_keeps_reading_but_redelivers_nothing_until_the_assignment() -> None:
    """An eager rebalance takes every partition from every replica, mostly to give them
    back. Until the next assignment the replica keeps its partitions and reads them, but
    redelivers from none: another replica given one may claim it at any moment, and on the
    embedded broker a claim that ends a transaction while its holder commits it holds the
    partition's readers for good. The assignment lets the due deliveries go."""
    h = Harness(partitions=(0, 1))
    h.claim(0, 1)
    t = h.tracker
    t._on_assigned([0, 1], 5)
    t._on_revoked([0, 1])
    assert h.group.commits == [{0: 10, 1: 10}], "what is settled is committed at the revoke"
    h.group.assigned = set()
    h.group.metadata = REBALANCING
    assert t.partitions() == [0, 1] and t._kept == {0, 1}
    made = {p: len(h.producers.made[p]) for p in (0, 1)}
    t._redeliver()
    for p in (0, 1):
        assert h.states[p].stats["redeliveries"] == 0 and h.states[p].in_flight == 1
        assert "begin_transaction" not in h.producers.last(p).calls, "no transaction"
        assert len(h.producers.made[p]) == made[p], "and no claim"
    assert t.stats()["rebalance_held"] == 1, "one round held back, and counted"
    t._commit(force=True)
    assert h.group.commits == [{0: 10, 1: 10}], "nothing committed while unsettled"
    assert t.stats()["partitions_revoked"] == 0
    h.group.assigned = {0, 1}
    h.group.metadata = GROUP_METADATA._replace(generation_id=6)
    t._on_assigned([0, 1], 6)
    t._redeliver()
    for p in (0, 1):
        assert h.states[p].stats["redeliveries"] == 1 and h.states[p].in_flight == 0
        assert h.producers.last(p).calls[-1] == "commit_transaction"
    t._on_revoked([0, 1])
    t._redeliver()
    assert t.stats()["rebalance_held"] == 1, "nothing due: nothing held back"


def test_a_replica_the_group_has_dropped_redelivers_nothing_until_it_has_joined_again() -> None:
    """kafka-python marks the member UNJOINED as soon as a heartbeat or a commit is told
    its member id is gone, before any revoke reaches the loop: its successor may be
    claiming the partitions already."""
    h = Harness(partitions=(0,))
    h.claim(0)
    t = h.tracker
    h.group.metadata = GROUP_METADATA._replace(generation_id=-1, state=MemberState.UNJOINED)
    t._redeliver()
    assert h.states[0].stats["redeliveries"] == 0 and t.stats()["rebalance_held"] == 1
    assert "begin_transaction" not in h.producers.last(0).calls
    h.group.metadata = GROUP_METADATA
    t._redeliver()
    assert h.states[0].stats["redeliveries"] == 1


def test_a_rebalance_that_begins_during_a_round_holds_the_transactions_not_begun() -> None:
    """kafka-python runs the rebalance on its IO thread, so one can begin while a round
    re-reads records: the partitions whose transaction has not begun wait, and their
    deliveries come due again."""
    h = Harness(partitions=(0,))
    h.claim(0)
    t = h.tracker
    now = time.monotonic()
    due = h.states[0].due(now, 10)
    assert due
    h.group.metadata = REBALANCING
    t._redeliver_due(due, now)
    assert h.states[0].stats["redeliveries"] == 0 and t.stats()["rebalance_held"] == 1
    assert "begin_transaction" not in h.producers.last(0).calls
    later = now + CONFIG.redelivery_retry_s + 1
    assert h.states[0].due_deadlines(later, 10), "due again after the retry delay"


def test_with_handoff_an_eager_rebalance_holds_back_only_once_it_has_lasted_long() -> None:
    """With beacons on, a replica given one of these partitions claims it only once this
    one has let it go, so the due deliveries go on out through the rebalance; one that
    has lasted KEEP_THROUGH_REBALANCE_S holds them back, so that a claim made after
    CLAIM_WAIT_MAX_S meets no transaction."""
    h = Harness(partitions=(0, 1), handoff=True)
    h.claim(0, 1)
    t = h.tracker
    t._on_assigned([0, 1], 5)
    t._on_revoked([0, 1])
    h.group.assigned = set()
    h.group.metadata = REBALANCING
    t._redeliver()
    assert h.states[0].stats["redeliveries"] == 1 and t.stats()["rebalance_held"] == 0
    assert t._rebalance_began is not None
    t._rebalance_began -= KEEP_THROUGH_REBALANCE_S
    late = expired_state(1)  # a lease come due since
    t._states[1] = late
    t._redeliver()
    assert late.stats["redeliveries"] == 0 and t.stats()["rebalance_held"] == 1
    assert KEEP_THROUGH_REBALANCE_S + 10 < CLAIM_WAIT_MAX_S, "a holder stops well before"
    t._on_assigned([0, 1], 6)
    assert t._rebalance_began is None


def test_with_handoff_a_replica_the_group_has_dropped_still_holds_back() -> None:
    h = Harness(partitions=(0,), handoff=True)
    h.claim(0)
    t = h.tracker
    h.group.metadata = GROUP_METADATA._replace(generation_id=-1, state=MemberState.UNJOINED)
    t._redeliver()
    assert h.states[0].stats["redeliveries"] == 0 and t.stats()["rebalance_held"] == 1


def own_view(h: Harness, holder_names: frozenset[int]) -> OwnerWatch:
    """This replica's own beacon read back just now, and replica 99, heard 0.1 s ago,
    naming ``holder_names``."""
    watch = h.tracker._owners
    assert watch is not None
    now = time.monotonic()
    watch.heard(99, holder_names, 100.0, now - 0.1)
    watch.heard(h.tracker._nonce, frozenset(h.tracker._states), now - 0.05, now - 0.05)
    return watch


def test_with_handoff_a_partition_a_live_replica_holds_is_claimed_once_it_lets_go() -> None:
    """Given partition 2 while replica 99 still names it, this replica reads it but does not
    claim it (the claim could end 99's transaction as it commits); once 99's newer owns
    entry leaves it out, it claims, then acts on nothing until a probe written after the
    claim is read back (99 may have redelivered from it just before letting go)."""
    h = Harness(partitions=(0, 1), handoff=True)
    h.claim(0, 1)
    t = h.tracker
    watch = own_view(h, frozenset({2}))
    t._on_assigned([0, 1, 2], 6)
    assert 2 in t._states and 2 not in h.producers.made, "tracked, not claimed"
    assert t.stats()["claim_waits"] == 1 and 2 in t._reclaim
    state = t._states[2] = expired_state(2)
    t._redeliver()
    assert 2 not in h.producers.made and state.stats["redeliveries"] == 0
    assert t.stats()["claim_waits"] == 1, "one wait, not one per round"
    now = time.monotonic()
    watch.heard(99, frozenset({1}), 99.0, now)  # older, read later: changes nothing
    watch.heard(99, frozenset(), 101.0, now)  # let go
    watch.heard(99, frozenset({2}), 100.5, now)  # older again
    t._redeliver()
    assert len(h.producers.made[2]) == 1, "claimed"
    assert state.stats["redeliveries"] == 0, "not before a probe written since the claim"
    [probe] = [s for s in h.plain.sent if s.partition == 2]
    assert parse(probe.value)[0][0][4] == state.probe_nonce, "sent at once, under the new nonce"
    state.on_record(11, probe.value, now)
    t._redeliver()
    assert state.stats["redeliveries"] == 1 and t._claim_wanted == {}


def test_with_handoff_a_claim_waits_at_most_claim_wait_max_s() -> None:
    h = Harness(partitions=(0,), handoff=True)
    h.claim(0)
    t = h.tracker
    own_view(h, frozenset({2}))
    t._on_assigned([0, 2], 6)
    assert 2 not in h.producers.made
    t._claim_wanted[2] -= CLAIM_WAIT_MAX_S
    t._redeliver()
    assert len(h.producers.made[2]) == 1, "claimed anyway"


def test_with_handoff_a_replica_that_has_not_read_its_own_beacons_back_waits() -> None:
    """A replica that has read no own beacon back (just started, still replaying) cannot
    tell who holds what; one whose partition nobody else names claims at once."""
    h = Harness(partitions=(0,), handoff=True)
    h.claim(0)
    t = h.tracker
    t._on_assigned([0, 2], 6)
    assert 2 not in h.producers.made and t.stats()["claim_waits"] == 1
    own_view(h, frozenset({1}))
    t._on_assigned([0, 2, 3], 7)
    assert len(h.producers.made[2]) == 1 and len(h.producers.made[3]) == 1
    assert 3 not in t._reclaim, "not waited for: no probe since the claim needed"


def given_2_elsewhere(h: Harness) -> OwnerWatch:
    """Replica 7 held 0, 1 and 2; an eager rebalance gives 2 to replica 99 (generation 6).
    Returns its owner watch, with its own beacon read back just now."""
    t = h.tracker
    h.claim(0, 1, 2)
    t._on_assigned([0, 1, 2], 5)
    t._on_revoked([0, 1, 2])
    h.group.metadata = REBALANCING
    h.group.assigned = {0, 1}
    h.group.metadata = GROUP_METADATA._replace(generation_id=6)
    t._on_assigned([0, 1], 6)
    watch = t._owners
    assert watch is not None
    now = time.monotonic()
    watch.heard(t._nonce, frozenset(t._states), now - 0.05, now - 0.05)
    return watch


def test_with_handoff_a_partition_given_away_is_served_until_its_new_holder_is_ready() -> None:
    """Its new holder claims it only once this replica lets go, and redelivers nothing from
    it before replaying it: so this one goes on redelivering from it (never committing)
    until the new holder's *ready* entry names it, and only then lets go (full chaos run
    62's late copies waited out that replay after their holder had let go)."""
    h = Harness(partitions=(0, 1, 2), handoff=True)
    t = h.tracker
    watch = given_2_elsewhere(h)
    assert t.partitions() == [0, 1, 2] and set(t._handing) == {2}
    assert h.writers.get(2) is not None and t.stats()["partitions_revoked"] == 1
    t._hand_off()
    assert 2 in t._handing, "99 has not named it yet"
    now = time.monotonic()
    watch.heard(99, frozenset({2}), 100.0, now)
    watch.heard_ready(99, frozenset(), 100.0, now)  # replaying it
    t._hand_off()
    assert 2 in t._handing
    state = t._states[2] = expired_state(2)
    t._redeliver()
    assert state.stats["redeliveries"] == 1
    t._commit(force=True)
    assert all(2 not in c for c in h.group.commits[1:]), "never committed after the revoke"
    watch.heard(99, frozenset({2}), 101.0, now)
    watch.heard_ready(99, frozenset({2}), 101.0, now)
    watch.heard_ready(99, frozenset(), 100.5, now)  # older, read later: changes nothing
    t._next_beacon = 99.0
    t._hand_off()
    assert t.partitions() == [0, 1] and h.writers.get(2) is None and not t._handing
    assert t._next_beacon == 0.0, "says at once that it has let 2 go"
    assert t.stats()["handed_off"] == 1 and t.stats()["handoffs_unready"] == 0
    assert t.stats()["partitions_revoked"] == 1, "counted once, at the assignment"


def test_with_handoff_a_partition_is_let_go_after_handoff_max_s_all_the_same() -> None:
    h = Harness(partitions=(0, 1, 2), handoff=True)
    t = h.tracker
    watch = given_2_elsewhere(h)
    now = time.monotonic()
    watch.heard(99, frozenset({2}), 100.0, now)
    watch.heard_ready(99, frozenset(), 100.0, now)
    t._handing[2] -= HANDOFF_MAX_S - 1
    t._hand_off()
    assert 2 in t._handing
    t._handing[2] -= 1
    t._hand_off()
    assert t.partitions() == [0, 1] and t.stats()["handoffs_unready"] == 1
    assert HANDOFF_MAX_S + 5 < CLAIM_WAIT_MAX_S, "let go well before the new holder claims"


def test_with_handoff_a_partition_being_handed_off_and_given_back_is_claimed_anew() -> None:
    """Given back in a later generation, it is this replica's again, claimed anew (the new
    holder may have claimed it meanwhile) and gated on a probe written since."""
    h = Harness(partitions=(0, 1, 2), handoff=True)
    t = h.tracker
    given_2_elsewhere(h)
    h.group.assigned = {0, 1, 2}
    h.group.metadata = GROUP_METADATA._replace(generation_id=8)
    t._on_revoked([0, 1])
    t._on_assigned([0, 1, 2], 8)
    assert t.partitions() == [0, 1, 2] and not t._handing and not t._kept
    assert 2 in t._reclaim and len(h.producers.made[2]) == 2, "claimed anew"
    assert h.producers.made[2][0].closed_with, "the old claim let go"


def test_with_handoff_a_rebalance_that_moves_it_again_keeps_the_first_handoff_time() -> None:
    h = Harness(partitions=(0, 1, 2), handoff=True)
    t = h.tracker
    given_2_elsewhere(h)
    since = t._handing[2] = t._handing[2] - 5
    t._on_revoked([0, 1])
    t._on_assigned([0, 1], 7)
    assert t._handing == {2: since} and t.stats()["partitions_revoked"] == 1


def test_with_handoff_an_unclaimed_partition_given_elsewhere_is_let_go_at_once() -> None:
    """Nothing can be redelivered from a partition not claimed: holding it would only keep
    its new holder from claiming it."""
    h = Harness(partitions=(0, 1), handoff=True)
    t = h.tracker
    h.claim(0)
    t._on_revoked([0, 1])
    t._on_assigned([0], 6)
    assert t.partitions() == [0] and not t._handing


def test_without_handoff_an_assigned_partition_is_claimed_at_once() -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    t = h.tracker
    own_view(h, frozenset({2}))
    t._on_assigned([0, 2], 6)
    assert len(h.producers.made[2]) == 1 and t.stats()["claim_waits"] == 0


def test_a_cooperative_rebalance_holds_nothing_back() -> None:
    """A cooperative rebalance takes a partition away (revoke) before giving it to anyone,
    so a replica redelivers from what it keeps all through it."""
    h = Harness(partitions=(0,))
    h.claim(0)
    t = h.tracker
    t.config = dataclasses.replace(CONFIG, rebalance="cooperative")
    h.group.metadata = REBALANCING
    t._redeliver()
    assert h.states[0].stats["redeliveries"] == 1 and t.stats()["rebalance_held"] == 0


def test_an_adopted_partition_is_not_redelivered_from_during_a_rebalance() -> None:
    """The assignment may give an adopted partition to another replica, which claims it
    at once: the adopter holds it back from the revoke to the assignment as well."""
    h = Harness(partitions=(0, 1))
    t = h.tracker
    h.claim(0, 1)
    now = time.monotonic()
    silent_owner_of_2(h).heard(t._nonce, frozenset({0, 1}), now - 0.2, now - 0.1)
    t._adopt()
    adopted = t._states[2] = expired_state(2)  # a lease of the silent owner's, due
    t._on_revoked([0, 1])
    t._redeliver()
    assert adopted.stats["redeliveries"] == 0 and adopted.in_flight == 1
    t._on_assigned([0, 1], GROUP_METADATA.generation_id + 1)
    assert 2 not in t._states, "not assigned: given up"


def test_kept_partitions_assigned_again_are_claimed_again_and_the_rest_dropped() -> None:
    h = Harness(partitions=(0, 1))
    h.claim(0, 1)
    before = h.producers.last(0)
    t = h.tracker
    t._on_revoked([0, 1])
    h.group.assigned = {0}
    t._on_assigned([0])
    assert t.partitions() == [0] and t.stats()["partitions_revoked"] == 1
    assert h.producers.last(1).closed_with, "the partition given away is let go"
    t._redeliver()
    assert h.producers.last(0) is not before and before.closed_with == [0.0], "claimed again"
    state = h.states[0]
    # Another replica may have redelivered from partition 0 before the claim: nothing is
    # due until a probe written since the claim is read back, and older ones do not count.
    assert state.stats["redeliveries"] == 0 and state.probe_nonce is not None
    now = time.monotonic()
    stale = (int(MarkerType.PROBE), 0, 0, int(now * 1000), state.probe_nonce ^ 1, 0, 0, 0)
    state.on_record(11, encode_entries([stale], []), now)
    t._redeliver()
    assert state.stats["redeliveries"] == 0 and state.stats["foreign_probe"] == 1
    [probe] = h.plain.sent  # sent with the claim, not at the next turn
    assert parse(probe.value)[0][0][4] == state.probe_nonce
    state.on_record(12, probe.value, now)
    t._redeliver()
    assert state.stats["redeliveries"] == 1 and t._reclaim == set()
    assert len(h.producers.made[0]) == 2, "one claim again, not one per round"


def test_kept_partitions_assigned_in_the_very_next_generation_keep_their_claims() -> None:
    """Held in generation 5, kept through the rebalance, assigned in 6: no other replica
    was given them in between, so no new claim and no wait for a fresh probe."""
    h = Harness(partitions=(0, 1))
    h.claim(0, 1)
    t = h.tracker
    t._on_assigned([0, 1], 5)
    producer = h.producers.last(0)
    t._on_revoked([0, 1])
    t._on_assigned([0], 6)
    assert t.partitions() == [0] and t._reclaim == set()
    assert h.producers.last(0) is producer and not producer.closed_with, "not let go"
    t._redeliver()
    assert h.states[0].stats["redeliveries"] == 1, "no probe waited for"
    assert len(h.producers.made[0]) == 1


def test_kept_partitions_assigned_after_a_missed_generation_are_claimed_again() -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    t = h.tracker
    t._on_assigned([0], 5)
    t._on_revoked([0])
    before = h.producers.last(0)
    t._on_assigned([0], 7)  # generation 6 went on without this replica
    assert t._reclaim == {0} and before.closed_with == [0.0], "let go, to claim anew"
    t._redeliver()
    assert h.states[0].stats["redeliveries"] == 0, "waits for a probe after the new claim"
    assert len(h.producers.made[0]) == 2


def silent_owner_of_2(h: Harness) -> OwnerWatch:
    """Replica 99, which holds markers partition 2, silent for 5 s; returns the watch."""
    watch = h.tracker._owners
    assert watch is not None
    watch.heard(99, frozenset({2}), 0.0, time.monotonic() - 5.0)
    return watch


def test_a_partition_adopted_then_assigned_in_the_next_generation_keeps_its_claim() -> None:
    h = Harness(partitions=(0, 1))
    t = h.tracker
    h.claim(0, 1)
    now = time.monotonic()
    silent_owner_of_2(h).heard(t._nonce, frozenset({0, 1}), now - 0.2, now - 0.1)
    t._adopt()  # in generation 5 (the stub's)
    assert t._kept == {2} and len(h.producers.made[2]) == 1
    t._on_assigned([0, 1, 2], GROUP_METADATA.generation_id + 1)
    assert t._reclaim == set() and len(h.producers.made[2]) == 1
    assert not h.producers.last(2).closed_with


def test_the_rebalance_listener_records_each_assignments_generation() -> None:
    generation = [3]
    listener = _Listener(lambda: generation[0])
    listener.on_partitions_revoked([TopicPartition("m", 0)])
    generation[0] = 4
    listener.on_partitions_assigned([TopicPartition("m", 0), TopicPartition("m", 2)])
    assert listener.take() == [(False, [0], None), (True, [0, 2], 4)]
    assert listener.take() == []


def test_a_kept_partition_that_cannot_be_claimed_again_redelivers_nothing() -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    t = h.tracker
    t._on_revoked([0])
    h.producers.fail[0] = {"init_transactions": KafkaTimeoutError("no coordinator")}
    t._on_assigned([0])  # claimed again at once: not answered
    assert t._reclaim == {0} and len(h.producers.made[0]) == 2
    t._redeliver()  # still not answered: it waits on for the same claim
    assert h.states[0].stats["redeliveries"] == 0 and t._reclaim == {0}
    assert len(h.producers.made[0]) == 2
    assert h.producers.last(0).calls == ["init_transactions"] * 2
    h.producers.fail.pop(0).clear()  # the broker answers
    t._redeliver()
    assert t._reclaim == set() and h.writers.get(0) is h.producers.last(0)
    assert len(h.producers.made[0]) == 2, "the claim that was waited on, not a new one"
    [probe] = h.plain.sent  # and then waits for a probe, sent at once
    assert parse(probe.value)[0][0][4] == h.states[0].probe_nonce


def test_an_assignment_claims_the_kept_and_the_new_partitions_together() -> None:
    """Their claims are all sent before any is waited for: however many partitions an
    assignment brings, the loop waits for their answers once (tracker.fencing)."""
    h = Harness(partitions=(0, 1))
    h.claim(0, 1)
    t = h.tracker
    t._on_revoked([0, 1])
    for p in (0, 1, 2):
        h.producers.fail[p] = {"init_transactions": KafkaTimeoutError("not answered yet")}
    h.claim_waits.clear()
    t._on_assigned([0, 1, 2])
    assert t._reclaim == {0, 1} and h.writers.claimed() == set()
    ids = [transactional_id(CONFIG.group_id, CONFIG.marker_topic, p) for p in (0, 1, 2)]
    assert h.claim_waits[:3] == [(i, 0.0) for i in ids], "sent, not waited for"
    assert [i for i, _ in h.claim_waits[3:]] == ids
    for p in (0, 1, 2):
        h.producers.fail.pop(p).clear()
    t._redeliver()
    assert h.writers.claimed() == {0, 1, 2} and t._reclaim == set()
    assert [len(h.producers.made[p]) for p in (0, 1, 2)] == [2, 2, 1], "the same claims"


def test_a_cooperative_revoke_gives_the_partition_up_at_once() -> None:
    h = Harness(partitions=(0, 1))
    t = h.tracker
    t.config = dataclasses.replace(CONFIG, rebalance="cooperative")
    h.claim(0, 1)
    t._on_revoked([1])
    assert t.partitions() == [0] and t._kept == set()
    assert t.stats()["partitions_revoked"] == 1 and h.writers.claimed() == {0}


def test_the_markers_reader_follows_the_states_and_the_group_member_fetches_nothing() -> None:
    h = Harness(partitions=(0, 1))
    t = h.tracker
    h.group.committed_at[2] = 7
    t._on_assigned([0, 1, 2])
    t._follow_states()
    assert h.group.reading == {0, 1, 2} and h.group.seeks == [(2, 7)], "only the new one"
    assert h.group.paused_tps == h.group.assignment() != set()
    t._fenced(1)
    t._follow_states()
    assert h.group.reading == {0, 2} and h.group.seeks == [(2, 7)]


def test_taking_a_fenced_partition_back_leaves_kept_ones_alone() -> None:
    h = Harness(partitions=(0, 1))
    h.claim(0, 1)
    t = h.tracker
    t._on_revoked([0, 1])
    t._fenced(1)
    t._take([1])  # what _retake_fenced does once the group has settled on giving it back
    assert t.partitions() == [0, 1] and t._kept == {0}
    t._on_assigned([0, 1])
    assert t._reclaim == {0}, "only the kept one is claimed again; 1 was claimed afresh"


# -- copies nobody takes ----------------------------------------------------------------------


def test_a_written_copy_is_watched_where_it_landed() -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    h.tracker._redeliver()
    state = h.states[0]
    copy = h.copies.sent[0]
    assert copy.topic == CONFIG.retry_topic and copy.partition is not None
    assert (state.in_flight, state.watched) == (0, 1)
    [(key, (queue, _))] = state._unread.items()
    assert (key, queue) == (delivery_key(RETRY_LANE, copy.partition, 0), "orders")


@pytest.mark.parametrize("second_placed", [True, False], ids=["placed-again", "never-placed"])
def test_a_copy_placed_at_no_offset_is_written_again_and_watched(second_placed: bool) -> None:
    """The broker took the copy without saying where (a retried write): written again, and
    the second write is the one watched; counted in ``stats:``."""
    h = Harness(partitions=(0,))
    h.claim(0)
    h.copies.unplaced = frozenset({0} if second_placed else {0, 1})
    h.tracker._redeliver()
    state = h.states[0]
    first, again = h.copies.sent
    assert (first.partition, first.value) == (again.partition, again.value)
    assert again.partition is not None
    assert h.tracker.stats()["copies_written_again"] == 1
    assert state.stats["redeliveries"] == 1 and state.in_flight == 0
    if second_placed:
        [(key, (queue, _))] = state._unread.items()
        assert (key, queue) == (delivery_key(RETRY_LANE, again.partition, 1), "orders")
    else:
        assert state.watched == 0, "nothing says where either landed"


def watched_copy_due(h: Harness, partition: int = 0) -> int:
    """Markers partition 0's one delivery copied to retry partition ``partition`` long
    enough ago that its watch is due; returns the copy's delivery key."""
    state = h.states[0]
    [due] = state.due(time.monotonic())
    key = delivery_key(RETRY_LANE, partition, 40)
    state.redelivered(due.key, copy=key, queue="orders", now=time.monotonic() - 10, unread_s=2)
    return key


@pytest.mark.parametrize(
    ("live", "copied_again"),
    [
        ((), False),  # nobody reads the queue: nowhere better to go
        ((0,), False),  # its reader is alive: it is coming
        ((0, 1), False),
        ((1,), True),  # its reader went silent, another reads: copy it there
        ((2,), True),  # a spare, outside the queue's window (kmq.layout.spare_candidates)
        ((7,), False),  # a partition the retry topic does not have (4) is nobody's
    ],
)
def test_a_copy_nobody_took_is_copied_again_only_toward_a_live_reader(
    live: tuple[int, ...], copied_again: bool
) -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    key = watched_copy_due(h)
    reads = f"orders {','.join(map(str, live))}".encode()
    if live:
        h.tracker._readers.note([("kmq.reads", reads)], time.monotonic())
    h.tracker._redeliver()
    state = h.states[0]
    if copied_again:
        txn = h.producers.last(0)
        assert [d.key for d in h.records.asked[-1]] == [key]
        assert h.copies.sent[-1].partition == live[0], "to the partition a live consumer reads"
        marker = decode(txn.sent[1].value)  # after the fence check
        assert marker.type is MarkerType.REDELIVERED and (marker.lane, marker.partition) == (
            RETRY_LANE,
            0,
        )
        assert state.stats["redeliveries:unread"] == 1
        assert state.watched == 1, "the new copy is watched in turn"
    else:
        assert h.records.asked == [] and state.stats["unread_waits"] == 1
        assert state.watched == 1 and state.next_deadline() is not None


@pytest.mark.parametrize(
    ("partition", "until_taken"),
    [(1, False), (0, False), (2, True), (3, True)],  # the window is (0, 1); 2 and 3 are spares
)
def test_a_copy_on_a_spare_is_watched_until_taken(partition: int, until_taken: bool) -> None:
    """No reader heard anywhere: a copy in the queue's window is read by whoever owns its
    queue partition once the group settles, so its watch may end; one on a spare is read
    only by a member given that spare, so it stays watched."""
    h = Harness(partitions=(0,))
    h.claim(0)
    key = watched_copy_due(h, partition=partition)
    state = h.states[0]
    asked: list[tuple[int, bool]] = []
    keep = state.keep_watching

    def recorded(key: int, now: float, unread_s: float, *, until_taken: bool = False) -> None:
        asked.append((key, until_taken))
        keep(key, now, unread_s, until_taken=until_taken)

    state.keep_watching = recorded  # type: ignore[method-assign]
    h.tracker._redeliver()
    assert asked == [(key, until_taken)]
    assert h.records.asked == [] and state.watched == 1


class ControlSends:
    """The tracker's plain producer, as far as the control topic's notices go."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    def send(self, topic: str, *, key: bytes, value: bytes | None) -> None:
        self.sent.append((topic, key, value))


def notices_sent(h: Harness) -> list[tuple[str, bytes, bytes | None]]:
    """What one check of the notices sends now (its half-second pace set aside)."""
    sends = ControlSends()
    raw: Any = h.tracker
    raw._producer = sends
    h.tracker._notices._next_check = 0.0
    h.tracker._notice_unread()
    return sends.sent


def test_a_copy_written_with_no_reader_heard_is_noticed_then_withdrawn() -> None:
    """Nobody reads the queue's retry lane (every reader killed, say): the tracker says on
    the control topic where the copy is (kmq.adopted), and withdraws that once a reader of
    the queue is heard again."""
    h = Harness(partitions=(0,))
    h.claim(0)
    h.tracker._redeliver()
    copy = h.copies.sent[0]
    assert copy.partition is not None
    key = unread_key(CONFIG.retry_topic, copy.partition, "orders")
    assert notices_sent(h) == [(CONFIG.control_topic, key, UNREAD_VALUE)]
    assert notices_sent(h) == [], "not again while it is on its way"
    table = h.tracker._pauses.table
    table.apply(key, UNREAD_VALUE)  # read back from the control topic
    assert notices_sent(h) == []
    h.tracker._readers.note([("kmq.reads", b"orders 3")], time.monotonic())
    assert notices_sent(h) == [(CONFIG.control_topic, key, None)]
    table.apply(key, None)
    assert notices_sent(h) == []
    assert h.tracker.stats()["unread_notices"] == h.tracker.stats()["unread_withdrawn"] == 1


def test_no_notice_while_a_reader_of_the_queue_is_heard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kmq.tracker")
    h = Harness(partitions=(0,))
    h.claim(0)
    h.tracker._readers.note([("kmq.reads", b"orders 1,3")], time.monotonic())
    h.tracker._redeliver()
    copy = h.copies.sent[0]
    assert copy.partition in (1, 3), "redelivered toward a reader heard"
    assert notices_sent(h) == []
    said = [r.getMessage() for r in caplog.records if "redelivered" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(
        f"to {CONFIG.retry_topic}:{copy.partition}; readers heard: 1,3"
    ), said


def test_a_standing_notice_another_replica_wrote_is_withdrawn_once_a_reader_is_heard() -> None:
    h = Harness(partitions=(0,))
    key = unread_key(CONFIG.retry_topic, 1, "orders")
    h.tracker._pauses.table.apply(key, UNREAD_VALUE)
    assert notices_sent(h) == [], "nobody heard: it stands"
    h.tracker._readers.note([("kmq.reads", b"orders 0")], time.monotonic())
    assert notices_sent(h) == [(CONFIG.control_topic, key, None)]


def test_a_copy_still_unread_with_no_reader_anywhere_is_noticed_again() -> None:
    h = Harness(partitions=(0,))
    h.claim(0)
    watched_copy_due(h, partition=1)
    h.tracker._redeliver()
    assert h.states[0].stats["unread_waits"] == 1
    key = unread_key(CONFIG.retry_topic, 1, "orders")
    assert notices_sent(h) == [(CONFIG.control_topic, key, UNREAD_VALUE)]


def test_broker_trouble_after_deliveries_are_taken_leaves_none_stranded() -> None:
    """A KafkaError out of a round after its deliveries were taken from their states: each
    is tried again after the retry interval, like any failed redelivery, and the error
    still ends the round. Before, they stayed marked as being redelivered and out of the
    deadline list for good: a NACK of such a copy, read later, was passed over as late and
    nothing redelivered it (chaos run 45 lost one message with those signs)."""
    h = Harness(partitions=(0,))
    h.claim(0)
    key = watched_copy_due(h)
    h.tracker._readers.note([("kmq.reads", b"orders 1")], time.monotonic())
    raw: Any = h.tracker

    def fails(partition: int, copies: list[Any]) -> None:
        raise KafkaTimeoutError("lost Kafka")

    raw._redeliver_partition = fails
    before = time.monotonic()
    with pytest.raises(KafkaTimeoutError):
        h.tracker._redeliver()
    state = h.states[0]
    assert state.stats["redelivery_failed"] == 1
    deadline = state.deadline_of(key)
    assert deadline is not None and deadline >= before + CONFIG.redelivery_retry_s
    assert state.next_deadline() == deadline, "back in the deadline list"
    nack = (int(MarkerType.NACK), RETRY_LANE, 1, 40, 2, 0, 0, 0)
    state.on_record(11, encode_entries([nack], []), time.monotonic())
    assert state.stats["nack"] == 1 and state.stats["late_marker"] == 0


def test_retry_partitions_unknown_to_a_broker_out_of_reach_fail_no_round() -> None:
    """Which retry partitions readers were heard on is checked against the topic's
    partition count; with that not cached and Kafka out of reach, what they said stands."""
    h = Harness(partitions=(0,))
    h.claim(0)
    watched_copy_due(h)
    h.tracker._readers.note([("kmq.reads", b"orders 0")], time.monotonic())
    raw: Any = h.tracker

    def unreachable(topic: str) -> int:
        raise KafkaTimeoutError("no metadata")

    raw._partition_count = unreachable
    h.tracker._redeliver()
    state = h.states[0]
    assert state.stats["unread_waits"] == 1, "its reader (0) is alive: it is coming"
    assert state.stats["redelivery_failed"] == 0 and state.watched == 1


def test_a_transactional_producer_that_cannot_reach_kafka_gives_up_within_a_second() -> None:
    """Building a partition's producer connects on the loop's thread: with a broker that
    accepts connections but never answers (a stalled network, say), it must fail as a
    BrokerError, which a claim survives, in about a second and not after kafka-python's
    30 s default, nor after a probe of the cause (which waits up to 5 s to connect)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        t = Tracker.__new__(Tracker)
        t.config = dataclasses.replace(CONFIG, bootstrap_servers=f"127.0.0.1:{port}")
        began = time.monotonic()
        with pytest.raises(BrokerError, match="within 1 s: no answer"):
            t._transactional_producer("grp.q.markers.0")
        took_s = time.monotonic() - began
    assert took_s < 5.0, f"the build held the loop {took_s:.1f} s"


def test_a_transactional_producer_batches_up_to_64_kb(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict[str, Any]] = []
    monkeypatch.setattr(kafka_clients, "producer", lambda conn, role, **kw: built.append(kw))
    t = Tracker.__new__(Tracker)
    t.config = dataclasses.replace(CONFIG, max_message_bytes=2048)
    t._transactional_producer("grp.q.markers.0")
    t.config = CONFIG
    t._transactional_producer("grp.q.markers.0")
    assert [kw["batch_size"] for kw in built] == [2048, 65_536]


def test_the_stats_line_says_the_slowest_turn_since_the_last_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = Tracker.__new__(Tracker)
    t.config = CONFIG
    t._states = {}
    t._retired = Counter()
    t._next_stats = 0.0
    t._slowest_turn_s, t._slowest_redelivery_s = 1.2344, 0.5006
    t._slowest_reread_s, t._slowest_txn_s = 0.3, 0.1504
    t._longest_read_gap_s, t._slowest_behind_s = 4.2, 3.9
    with caplog.at_level("INFO", logger="kmq.tracker"):
        t._log_stats()
    assert "turn_max_ms=1234" in caplog.text and "redeliver_max_ms=501" in caplog.text
    assert "reread_max_ms=300" in caplog.text and "txn_max_ms=150" in caplog.text
    assert "read_gap_max_ms=4200" in caplog.text and "behind_max_ms=3900" in caplog.text
    slowest = (t._slowest_turn_s, t._slowest_redelivery_s, t._slowest_reread_s, t._slowest_txn_s,
               t._longest_read_gap_s, t._slowest_behind_s)  # fmt: skip
    assert slowest == (0.0,) * 6, "per stats line"


def test_the_read_gap_counts_only_polls_without_markers_while_messages_are_in_flight() -> None:
    h = Harness(partitions=(0,))
    t = h.tracker
    assert t._states[0].in_flight > 0
    t._note_read(True, 10.0)
    t._note_read(False, 11.0)
    t._note_read(False, 13.5)
    assert t._longest_read_gap_s == 3.5
    t._note_read(True, 14.0)
    t._note_read(False, 14.5)
    assert t._longest_read_gap_s == 3.5, "a read starts the gap over"
    t._states = {}
    t._note_read(False, 30.0)
    assert t._longest_read_gap_s == 3.5, "nothing in flight: no markers are owed"
    t._states = {0: expired_state(0)}
    t._note_read(False, 31.0)
    assert t._longest_read_gap_s == 3.5, "the gap starts where nothing was in flight"


def test_behind_max_is_the_longest_a_partition_stood_still_below_its_high_watermark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = Harness(partitions=(0, 1))
    t = h.tracker
    clock = [1000.0]
    monkeypatch.setattr("tracker.daemon.time.monotonic", lambda: clock[0])
    t._watch_stall(0, 5, 9)
    t._watch_stall(1, 7, 7)
    clock[0] += 2.5
    t._watch_stall(0, 5, 12)  # more written, none of it read
    t._watch_stall(1, 7, 7)  # at the end: not behind, however long
    assert t._slowest_behind_s == 2.5
    clock[0] += 1.0
    t._watch_stall(0, 6, 12)  # it moved
    assert t._slowest_behind_s == 2.5


def _state_with_starts(partition: int, read_at: list[float]) -> PartitionState:
    """A caught-up state with one START read at each of ``read_at`` (lease LEASE_MS)."""
    state = PartitionState(partition)
    state.set_position(10)
    state.set_end_offset(10)
    for i, now in enumerate(read_at):
        start = (int(MarkerType.START), QUEUE_LANE, 3, 100 + i, 1, LEASE_MS, 0, 0)
        state.on_record(10 + i, encode_entries([start], []), now)
    return state


@pytest.mark.parametrize(
    ("read_at", "now", "expected_ms"),
    [  # times exact in binary: the deadline - now below is exact
        ([], 50.0, 1000),  # nothing in flight: the longest wait
        ([50.5], 50.0, 1000),  # due at 51.5: after the longest wait
        ([49.25], 50.0, 250),  # due at 50.25: wake then
        ([49.0625], 50.0, 63),  # 62.5 ms: rounded up, never early
        ([48.0, 49.125], 50.0, 125),  # one already passed (awaits its probe), the next later
        ([49.0], 50.0, 1000),  # due exactly now: passed, nothing later
        ([49.0 + 2**-20], 50.0, 1),  # due within the millisecond: at least 1 ms
    ],
)
def test_the_markers_poll_wakes_when_the_next_deadline_passes(
    read_at: list[float], now: float, expected_ms: int
) -> None:
    state = _state_with_starts(0, read_at)
    assert markers_wait_ms([state], now, 1000) == expected_ms


def test_the_markers_poll_wait_is_the_earliest_of_every_partition() -> None:
    states = [_state_with_starts(0, [49.5]), _state_with_starts(1, [49.25, 49.75])]
    assert markers_wait_ms(states, 50.0, 1000) == 250
    assert states[1].next_deadline() == 50.25
    assert states[1].next_deadline(after=50.25) == 50.75
    assert states[1].next_deadline(after=50.75) is None


def beaconing(partitions: tuple[int, ...]) -> tuple[Tracker, StubTxnProducer]:
    """A harnessed replica holding ``partitions`` whose plain producer is a stub."""
    h = Harness(partitions=partitions)
    return h.tracker, h.plain


def test_a_replica_writes_a_beacon_to_every_markers_partition_each_second() -> None:
    t, producer = beaconing((0, 1))
    t._next_beacon = time.monotonic() + 3600  # not due
    t._probe()
    assert producer.sent == []
    t._next_beacon = 0.0
    t._probe()
    partitions = [s.partition for s in producer.sent]
    assert len(partitions) == 4 and set(partitions) == {0, 1, 2, 3}, "all, not only its own"
    sent = [parse(s.value) for s in producer.sent]
    assert all(s.topic == CONFIG.marker_topic for s in producer.sent)
    for entries, texts in sent:
        assert len(entries) == 3
        assert all(e[0] == MarkerType.PROBE and e[4] == 0 for e in entries)
        assert parse_beacon(entries[0][3], texts[0]) == (t._nonce, {}, None)
        assert parse_owns(texts[1]) == (t._nonce, frozenset({0, 1})), "what it holds"
        assert parse_ready(texts[2]) == (t._nonce, frozenset({0, 1})), "both replayed"
    assert t._next_beacon >= time.monotonic() + BEACON_S - 1.0
    t._probe()
    assert len(producer.sent) == 4, "the next one a second later"


def test_a_take_over_reads_committed_offsets_beside_the_group_member() -> None:
    """Not through the group member: its coordinator connection holds its JoinGroup at the
    broker for a whole rebalance, and a committed() sent behind it waits as long."""
    h = Harness(partitions=(0,))
    h.claim(0)
    t = h.tracker
    offsets = StubGroupConsumer()
    offsets.committed_at = {2: 40}
    h.group.committed_at = {2: 7}  # what the member would say: never asked
    raw: Any = t
    raw._offsets = offsets
    t._take([2], adopted=True)
    assert t._states[2].position == 40


def test_a_claimed_partition_is_probed_during_its_replay() -> None:
    """So the probe is read back right behind the replay (PartitionState.
    replay_probe_needed); not before the claim, nor under a nonce about to change."""
    h = Harness(partitions=(0, 1, 2))
    h.claim(0, 2)
    t, producer = h.tracker, h.plain
    t._next_beacon = time.monotonic() + 3600  # no beacon now
    for p in (0, 1, 2):
        state = t._states[p] = PartitionState(p, probe_nonce=t._nonce)
        state.set_position(0)
        state.set_end_offset(5)
    t._reclaim.add(2)  # claimed, but to be claimed again (a new nonce) first
    t._probe()
    assert [s.partition for s in producer.sent] == [0], "1 is not claimed yet"
    entries, texts = parse(producer.sent[0].value)
    assert [(e[0], e[4]) for e in entries] == [(MarkerType.PROBE, t._nonce)] and texts == [b""]
    t._probe()
    assert len(producer.sent) == 1, "not again within PROBE_RETRY_S"


def test_a_busy_loop_is_vouched_for_and_its_partitions_stay_held_elsewhere() -> None:
    """While the loop is in a long turn (a slow redelivery round), the voucher writes the
    owns entry its beacon would have carried, alone in a record, to every partition the
    last beacon went to; another replica reading it sees the partitions held, and adopts
    none of them, where without it they are orphans after the silence."""
    t, producer = beaconing((0, 1))
    t._beacon_partitions = 0
    t._retired = Counter()
    never = float("-inf")
    assert not t._vouch_due(time.monotonic(), never), "no beacon yet: no partitions to write to"
    t._probe()  # the loop's beacon
    beacon_records = len(producer.sent)
    t._last_turn = time.monotonic()  # a turn begins, and lasts
    late = t._next_beacon + 0.5
    assert t._vouch_due(late, never)
    t._vouch(late)
    vouched = producer.sent[beacon_records:]
    assert [s.partition for s in vouched] == [0, 1, 2, 3]
    for entries, texts in (parse(s.value) for s in vouched):
        assert len(entries) == 2
        assert all(e[0] == MarkerType.PROBE and e[4] == 0 for e in entries)
        assert parse_owns(texts[0]) == (t._nonce, frozenset({0, 1}))
        assert parse_ready(texts[1]) == (t._nonce, frozenset({0, 1}))
    assert t.stats()["owns_vouched"] == 1
    assert not t._vouch_due(t._last_turn + VOUCH_TURN_S, late), "a stuck turn is not"

    def other(read: list[tuple[float, bytes]]) -> OwnerWatch:
        """Another replica holding partition 3: its own beacons at 0.0 .. 4.0 (its clock),
        and ``read``: (when, record value) of this replica's records on partition 3."""
        watch = OwnerWatch(own=55, silence_s=2.0)
        state = PartitionState(3, probe_nonce=55, owners=watch)
        state.set_position(0)
        state.set_end_offset(0)
        records: list[tuple[float, bytes]] = [
            (at, encode_entries([(int(MarkerType.PROBE), 0, 3, int(at * 1000), 0, 0, 0,
                                  len(owns_text(55, {3})))], [owns_text(55, {3})]))
            for at in (0.0, 1.0, 2.0, 3.0, 4.0)
        ]  # fmt: skip
        for offset, (at, value) in enumerate(sorted(records + read, key=lambda r: r[0])):
            state.on_record(offset, value, at)
        return watch

    beacon = producer.sent[3].value  # this replica's beacon + owns record to partition 3
    vouch = vouched[3].value
    assert other([(0.5, beacon)]).orphans(4.0, {3}) == [0, 1], "silent since 0.5: adopted"
    kept = other([(0.5, beacon), (1.5, vouch), (2.5, vouch), (3.5, vouch)])
    assert kept.orphans(4.0, {3}) == [], "vouched for: held by a live replica"
    assert kept.held_elsewhere(4.0) == {0, 1}


def test_a_ready_entry_names_the_held_partitions_replayed_and_not_being_handed_off() -> None:
    t, producer = beaconing((0, 1, 2))
    t._states[1] = PartitionState(1)  # just given: its replay has not begun
    t._handing = {2: time.monotonic()}
    t._probe()
    for _, texts in (parse(s.value) for s in producer.sent):
        assert parse_owns(texts[1]) == (t._nonce, frozenset({0, 1, 2}))
        assert parse_ready(texts[2]) == (t._nonce, frozenset({0}))


def test_a_replica_holding_no_partition_writes_beacons_too() -> None:
    """Its beacons, read back in the replay of a partition it is given later, bound that
    partition's leases on its own clock (tracker.handover)."""
    t, producer = beaconing(())
    t._probe()
    assert [s.partition for s in producer.sent] == [0, 1, 2, 3]
    for entries, texts in (parse(s.value) for s in producer.sent):
        assert parse_beacon(entries[0][3], texts[0]) == (t._nonce, {}, None)
        assert parse_owns(texts[1]) == (t._nonce, frozenset()), "holds nothing"


def test_a_tick_names_its_writers_clock() -> None:
    clocks = ClockBounds(own=7)
    state = PartitionState(0, probe_nonce=99, clocks=clocks)  # regated: nonce != clock
    state.set_position(0)
    state.set_end_offset(0)
    _, text = state.tick(5.0, (3, 4.0))
    assert parse_tick(5000, text) == (3, 4000, 7)


def test_a_silent_owners_partition_is_adopted_claimed_and_left_at_the_next_assignment() -> None:
    h = Harness(partitions=(0, 1))
    t = h.tracker
    h.claim(0, 1)
    watch = silent_owner_of_2(h)
    now = time.monotonic()
    watch.heard(88, frozenset({3}), 0.0, now - 0.5)  # a live one
    t._adopt()
    assert t.partitions() == [0, 1], "its own beacons not read back past the silence yet"
    watch.heard(t._nonce, frozenset({0, 1}), now - 0.2, now - 0.1)
    t._adopt()
    assert t.partitions() == [0, 1, 2]
    assert t._kept == {2} and t._retired["partitions_adopted"] == 1
    assert h.writers.get(2) is not None, "claimed: the silent owner is fenced"
    assert t._next_beacon == 0.0, "says at once that it holds it"
    t._adopt()
    assert t._retired["partitions_adopted"] == 1, "once"
    t._states[2].set_position(9)
    t._commit(force=True)
    assert h.group.commits and all(2 not in c for c in h.group.commits), (
        "never committed: the group did not give it"
    )
    t._on_assigned([0, 1])  # the group gave it to another replica
    assert t.partitions() == [0, 1] and h.writers.get(2) is None
    now = time.monotonic()
    watch.heard(t._nonce, frozenset({0, 1}), now, now)  # own beacon read back at once
    t._adopt()
    assert t.partitions() == [0, 1] and t._retired["partitions_adopted"] == 1, (
        "not taken up again: the group has just given it to another, which has yet to say so"
    )


def adopted_2_with_handoff() -> tuple[Harness, OwnerWatch]:
    """A replica with handoff, given 0 and 1, that has adopted 2 from silent replica 99."""
    h = Harness(partitions=(0, 1), handoff=True)
    t = h.tracker
    h.claim(0, 1)
    watch = silent_owner_of_2(h)
    now = time.monotonic()
    watch.heard(t._nonce, frozenset({0, 1}), now - 0.2, now - 0.1)
    t._adopt()
    assert t.partitions() == [0, 1, 2] and h.writers.get(2) is not None
    return h, watch


def test_an_adopted_partition_is_let_go_once_its_assignee_has_replayed_it() -> None:
    """Replica 99 wakes, is fenced by the adoption, and takes partition 2 up again, since
    the settled generation still gives it 2: it names 2 and waits for this replica to let
    go (handoff). This one goes on redelivering from 2 until 99 says (its *ready* entry)
    that it has replayed 2, then lets go between rounds, and says so at once."""
    h, watch = adopted_2_with_handoff()
    t = h.tracker
    t._yield_adopted()
    t._hand_off()
    assert t.partitions() == [0, 1, 2] and not t._handing, "nobody live names it: kept"
    now = time.monotonic()
    watch.heard(99, frozenset({2}), 200.0, now)  # 99 again, read just now, still replaying
    watch.heard_ready(99, frozenset(), 200.0, now)
    watch.heard(t._nonce, frozenset({0, 1, 2}), now, now)
    t._yield_adopted()
    t._hand_off()
    assert t.partitions() == [0, 1, 2] and 2 in t._handing and 2 not in t._kept
    assert t.stats()["adopted_let_go"] == 1
    state = t._states[2] = expired_state(2)  # a lease of the silent owner's comes due
    t._redeliver()
    assert state.stats["redeliveries"] == 1, "served until 99 can take it"
    t._commit(force=True)
    assert all(2 not in c for c in h.group.commits), "but never committed"
    t._next_beacon = 99.0
    watch.heard(99, frozenset({2}), 201.0, now)
    watch.heard_ready(99, frozenset({2}), 201.0, now)
    t._hand_off()
    assert t.partitions() == [0, 1] and h.writers.get(2) is None and not t._handing
    assert t._next_beacon == 0.0, "says at once that it has let 2 go"
    assert t.stats()["handed_off"] == 1 and t.stats()["partitions_revoked"] == 0


def test_an_adopted_partition_is_let_go_at_once_to_a_replica_that_writes_no_ready_entry() -> None:
    """A replica of kmq before *ready* entries never says it has replayed a partition: it
    is handed one as soon as it names it, as then."""
    h, watch = adopted_2_with_handoff()
    t = h.tracker
    now = time.monotonic()
    watch.heard(99, frozenset({2}), 200.0, now)
    watch.heard(t._nonce, frozenset({0, 1, 2}), now, now)
    t._yield_adopted()
    t._hand_off()
    assert t.partitions() == [0, 1] and not t._handing


@pytest.mark.parametrize("why", ["rebalancing", "assigned here", "no handoff"])
def test_an_adopted_partition_named_elsewhere_is_kept_while_the_group_may_give_it_here(
    why: str,
) -> None:
    h, watch = adopted_2_with_handoff()
    t = h.tracker
    if why == "rebalancing":
        h.group.metadata = REBALANCING
    elif why == "assigned here":
        h.group.assigned = {0, 1, 2}
    else:
        t._handoff = False
    now = time.monotonic()
    watch.heard(99, frozenset({2}), 200.0, now)
    watch.heard(t._nonce, frozenset({0, 1, 2}), now, now)
    t._yield_adopted()
    assert t.partitions() == [0, 1, 2] and h.writers.get(2) is not None
    assert t.stats()["adopted_let_go"] == 0


def test_a_partition_read_no_further_is_reported_once_and_not_while_kafka_is_lost(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(partitions=(0,))
    t = h.tracker
    clock = [1000.0]
    monkeypatch.setattr("tracker.daemon.time.monotonic", lambda: clock[0])
    caplog.set_level(logging.WARNING, logger="kmq.tracker")

    def turn(after_s: float, position: int = 5) -> None:
        clock[0] += after_s
        t._watch_stall(0, position, 9)

    turn(0)
    turn(CONFIG.stalled_after_s - 1)
    assert not t._stalls[0].stalled_for(clock[0]) and t.stats()["stalled"] == 0
    turn(1)
    turn(5)
    assert t._stalls[0].stalled_for(clock[0]) == CONFIG.stalled_after_s + 5
    assert t.stats()["stalled"] == 1
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert "reading has stood at offset 5, below the high watermark 9" in caplog.text
    t._link.failed("down", clock[0])  # Kafka lost: nothing is read, and no stall is told
    turn(1)
    turn(CONFIG.stalled_after_s * 2)
    assert not t._stalls[0].stalled_for(clock[0]) and t.stats()["stalled"] == 1
    assert "no longer stalled" in caplog.records[-1].getMessage()


class _PeekStub:
    """The peek's consumer: hands out ``records`` once any partition is assigned."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = records
        self.assigned: list[int] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = [tp.partition for tp in partitions]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        pass

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
        out, self.records = self.records, []
        return {TopicPartition(CONFIG.marker_topic, 0): [SimpleNamespace(value=v) for v in out]}

    def close(self) -> None:
        pass


def _owns_record(clock: int, partitions: set[int], sent_s: float) -> bytes:
    text = owns_text(clock, partitions)
    entry = (int(MarkerType.PROBE), 0, 0, floor_ms(sent_s), 0, 0, 0, len(text))
    return encode_entries([entry], [text])


@pytest.mark.parametrize("peer_alive", [False, True], ids=["peer-dead", "peer-alive"])
def test_a_replica_whose_reading_is_held_judges_silence_by_owns_entries_past_the_hold(
    monkeypatch: pytest.MonkeyPatch, peer_alive: bool
) -> None:
    """A transaction left open by a killed peer can hold this replica's own partitions
    (tracker.peek): its own beacons are not read back, so it could never tell that the
    peer is silent. Read past the hold, its beacons say so, and the peer's would say it
    lives."""
    h = Harness(partitions=(0, 1))
    t = h.tracker
    h.claim(0, 1)
    silent_owner_of_2(h)
    t._adopt()
    assert t.partitions() == [0, 1], "held: own beacons not read back, nothing adopted"
    now = time.monotonic()
    records = [_owns_record(t._nonce, {0, 1}, now - 0.1)]
    if peer_alive:  # its voucher still writes while its loop waits on a slow commit
        records.append(_owns_record(99, {2}, now - 0.2))
    stub = _PeekStub(records)
    t._peek = OwnsPeek(stub, CONFIG.marker_topic)
    clock = [now]
    monkeypatch.setattr("tracker.daemon.time.monotonic", lambda: clock[0])
    t._watch_stall(0, 5, 9)
    clock[0] += 0.5
    t._watch_stall(0, 5, 12)
    t._peek_owns()
    assert stub.assigned == [], "held 0.5 s: not yet read past"
    clock[0] += HELD_S
    t._watch_stall(0, 5, 15)
    t._peek_owns()
    assert stub.assigned == [0]
    assert t._retired["owns_peeked"] == len(records)
    t._adopt()
    assert t.partitions() == ([0, 1] if peer_alive else [0, 1, 2])
    clock[0] += 0.1
    t._watch_stall(0, 6, 15)  # it moved: the hold is over
    t._peek_owns()
    assert stub.assigned == []


def test_a_replica_says_at_once_that_a_replay_is_over() -> None:
    """A holder handing a partition over lets go once the new holder names it in its
    *ready* entry: the end of a replay is said in the round that sees it, not at the next
    beacon (up to a second later)."""
    h = Harness(partitions=(), handoff=True)
    t = h.tracker
    state = t._states[2] = PartitionState(2, probe_nonce=t._nonce, owners=t._owners)
    state.set_position(0)  # assigned: replayed from its committed offset
    h.group.positions, h.group.highwaters = {2: 1}, {2: 3}
    t._next_beacon = time.monotonic() + 1.0
    t._sync_offsets()
    assert state.replaying and t._next_beacon > 0.0
    assert t._ready() == []
    h.group.positions = {2: 3}
    t._sync_offsets()
    assert not state.replaying and t._next_beacon == 0.0
    assert t._ready() == [2]
    t._next_beacon = time.monotonic() + 1.0
    t._sync_offsets()
    assert t._next_beacon > 0.0, "once"


def test_the_end_of_a_replay_is_logged_once_with_its_uncovered_leases(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = PartitionState(3)
    state.set_position(0)
    state.set_end_offset(1)
    state.on_record(0, marker(MarkerType.START, (0, 1, 40)), 5.0)
    with caplog.at_level(logging.INFO, logger="kmq.tracker"):
        Tracker._log_replay_leases(3, state)
        Tracker._log_replay_leases(3, state)
    said = [r.getMessage() for r in caplog.records if "replay over" in r.getMessage()]
    assert said == [
        "partition 3: replay over with 1 open leases, 0 taken over from ticks, "
        "1 running a full lease from the replay"
    ]


def test_overdue_leases_held_by_a_claim_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.producers.fail[1] = {"init_transactions": KafkaTimeoutError("no coordinator")}
    with caplog.at_level(logging.INFO, logger="kmq.tracker"):
        h.tracker._redeliver()
        h.tracker._redeliver()
        said = [r.getMessage() for r in caplog.records if "overdue wait" in r.getMessage()]
        assert len(said) == 1 and re.match(r"markers partition 1: leases \d+\.\d s ", said[0])
        assert "not claimed yet" in said[0], "partition 0 was claimed in the same round"
        assert h.tracker._retired["leases_held"] == 1
        h.producers.fail.pop(1).clear()
        h.tracker._redeliver()  # claimed and redelivered: its copy watched, not overdue
        now = time.monotonic()
        assert (h.states[1].first_lease_deadline(now) or now) >= now
        h.tracker._redeliver()
    assert len([r for r in caplog.records if "overdue wait" in r.getMessage()]) == 1


def test_overdue_leases_held_by_a_rebalance_say_so(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(partitions=(0,))
    h.group.metadata = GROUP_METADATA._replace(generation_id=-1, state=MemberState.UNJOINED)
    with caplog.at_level(logging.INFO, logger="kmq.tracker"):
        h.tracker._redeliver()
    said = [r.getMessage() for r in caplog.records if "overdue wait" in r.getMessage()]
    assert len(said) == 1 and "a rebalance holds every redelivery" in said[0]
    assert h.records.asked == []


def test_a_hold_is_said_again_once_its_partition_is_taken_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(partitions=(1,))
    h.producers.fail[1] = {"init_transactions": KafkaTimeoutError("no coordinator")}
    with caplog.at_level(logging.INFO, logger="kmq.tracker"):
        h.tracker._redeliver()
        h.tracker._drop([1])
        h.tracker._states[1] = expired_state(1)
        h.tracker._redeliver()
    said = [r.getMessage() for r in caplog.records if "overdue wait" in r.getMessage()]
    assert len(said) == 2 and all("not claimed yet" in m for m in said)
