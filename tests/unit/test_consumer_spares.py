"""A consumer's spare retry partitions (kmq.layout.spare_candidates) and adopted ones
(kmq.adopted), against a stub reader."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import IllegalStateError
from kafka.structs import ConsumerGroupMetadata, MemberState

from kmq.adopted import Adopted
from kmq.consumer import Consumer
from kmq.control import UNREAD_VALUE, ControlTable, unread_key
from kmq.reads import READS_HEADER, decode_reads


class StubRetryReader:
    """Every partition read to its end (position at the high watermark), unless ``ends``
    says otherwise: partition -> (position, high watermark), None where not known yet."""

    def __init__(self) -> None:
        self.assigned: list[TopicPartition] = []
        self.ends: dict[int, tuple[int | None, int | None]] = {}

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.ends.get(tp.partition, (0, 0))[1]

    def position(self, tp: TopicPartition, timeout_ms: int | None = None) -> int | None:
        assert timeout_ms == 0, "the loop's thread never waits on an offset lookup"
        if tp not in self.assigned:
            raise IllegalStateError("Partition is not assigned")
        return self.ends.get(tp.partition, (0, 0))[0]


class StubControl:
    """The control watcher: its table, and a version bumped with each record applied."""

    def __init__(self) -> None:
        self.table = ControlTable()
        self.version = 0

    def apply(self, key: bytes, value: bytes | None) -> None:
        self.table.apply(key, value)
        self.version += 1


class StubGroupMember:
    def __init__(self) -> None:
        self.metadata = ConsumerGroupMetadata("g", -1, "", None, MemberState.REBALANCING)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self.metadata


def idle_consumer() -> Any:
    """Queue "jobs" on queue partition 0 and retry partition 0 of four; owns nothing."""
    consumer: Any = Consumer.__new__(Consumer)
    consumer.queue = "jobs"
    consumer._retry_topic = "jobs.retry"
    consumer._queue_window = (0,)
    consumer._retry_window = (0,)
    consumer._retry_read = frozenset({0})
    consumer._spare_candidates = frozenset({1, 2, 3})
    consumer._assigned = frozenset()
    consumer._spares = frozenset()
    consumer._spares_reading = frozenset()
    consumer._retry_reading = frozenset()
    consumer._rc = StubRetryReader()
    consumer._pauses = StubControl()
    consumer._kc = StubGroupMember()
    consumer._adopted = Adopted(hold_s=12.0)
    consumer._noticed = frozenset()
    consumer._notices_version = -1
    consumer._at_most_once = False
    return consumer


def test_a_spare_given_at_a_join_is_read_and_named_in_the_reads_header() -> None:
    consumer = idle_consumer()
    consumer._on_spares(frozenset({2}))
    # Given, not read yet: the next join's metadata already claims it, so the leader cannot
    # give it to another member before this one starts reading it.
    assert consumer._spare_state() == (frozenset({1, 2, 3}), frozenset({2}))
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [TopicPartition("jobs.retry", 2)]
    [(key, value)] = consumer._reads
    assert (key, decode_reads(value)) == (READS_HEADER, ("jobs", frozenset({2})))
    assert consumer._spare_state() == (frozenset({1, 2, 3}), frozenset({2}))


def test_a_spare_that_joins_the_queues_own_partitions_is_no_longer_read_as_one() -> None:
    consumer = idle_consumer()
    consumer._on_spares(frozenset({2}))
    consumer._follow_queue_partitions()
    consumer._spare_candidates = frozenset({1, 3})  # the queue's spread grew over 2
    consumer._retry_read = frozenset({0, 2})
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [] and consumer._reads == []
    assert consumer._spare_state() == (frozenset({1, 3}), frozenset())


def test_a_leader_that_gives_no_spares_stops_the_reading() -> None:
    consumer = idle_consumer()
    consumer._on_spares(frozenset({3}))
    consumer._follow_queue_partitions()
    consumer._on_spares(frozenset())
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [] and consumer._spare_state()[1] == frozenset()


def test_a_consumer_reading_nothing_reads_what_a_tracker_says_nobody_reads() -> None:
    """Every reader of the queue killed: a new consumer, its group still waiting for them,
    reads the noticed retry partition and names it (so the tracker hears a reader), until
    its group settles."""
    consumer = idle_consumer()
    consumer._pauses.apply(unread_key("jobs.retry", 0, "jobs"), UNREAD_VALUE)
    consumer._pauses.apply(unread_key("jobs.retry", 3, "other"), UNREAD_VALUE)
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [TopicPartition("jobs.retry", 0)]
    [(key, value)] = consumer._reads
    assert (key, decode_reads(value)) == (READS_HEADER, ("jobs", frozenset({0})))
    consumer._pauses.apply(unread_key("jobs.retry", 0, "jobs"), None)  # withdrawn: heard
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [TopicPartition("jobs.retry", 0)], "kept: not settled"
    consumer._kc.metadata = ConsumerGroupMetadata("g", 0, "m", None, MemberState.STABLE)
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [] and consumer._reads == [], "its owner reads it now"


@pytest.mark.parametrize(
    "ends",
    [(None, None), (None, 7), (3, 7)],
    ids=["not fetched yet", "no position yet", "copies left"],
)
def test_an_adopted_partition_is_read_to_its_end_before_it_is_given_up(
    ends: tuple[int | None, int | None],
) -> None:
    """Full chaos run 73: adopted as the member's first join was ending, given up once it
    had settled, before its copies were fetched, then read by nobody for 20 s."""
    consumer = idle_consumer()
    consumer._pauses.apply(unread_key("jobs.retry", 0, "jobs"), UNREAD_VALUE)
    consumer._follow_queue_partitions()
    consumer._rc.ends[0] = ends
    consumer._kc.metadata = ConsumerGroupMetadata("g", 0, "m", None, MemberState.STABLE)
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [TopicPartition("jobs.retry", 0)], "still read"
    consumer._rc.ends[0] = (7, 7)
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [] and consumer._reads == [], "read through: let go"


def test_a_consumer_that_reads_a_spare_adopts_nothing() -> None:
    consumer = idle_consumer()
    consumer._on_spares(frozenset({2}))
    consumer._pauses.apply(unread_key("jobs.retry", 0, "jobs"), UNREAD_VALUE)
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [TopicPartition("jobs.retry", 2)]


def test_an_adopted_partition_the_group_then_gives_stays_read() -> None:
    consumer = idle_consumer()
    consumer._pauses.apply(unread_key("jobs.retry", 0, "jobs"), UNREAD_VALUE)
    consumer._follow_queue_partitions()
    consumer._kc.metadata = ConsumerGroupMetadata("g", 0, "m", None, MemberState.STABLE)
    consumer._assigned = frozenset({0})  # the queue partition retry partition 0 goes with
    consumer._follow_queue_partitions()
    assert consumer._rc.assigned == [TopicPartition("jobs.retry", 0)]
    assert consumer._adopted.partitions == frozenset()


class StubMarkerWriter:
    """The marker writer, as far as announcing goes: partition 1 was written to lately."""

    def __init__(self) -> None:
        self.added: list[list[tuple[Any, int]]] = []
        self.flushed = 0

    def quiet_partitions(self, since: float) -> list[int]:
        return [0, 2, 3]

    def add_many(self, entries: list[tuple[Any, int]]) -> None:
        self.added.append(entries)

    def flush_soon(self) -> None:
        self.flushed += 1


def announced(consumer: Any, at: float) -> list[int]:
    writer = consumer._writer
    before = len(writer.added)
    consumer._announce(at)
    return [p for entries in writer.added[before:] for _, p in entries]


@pytest.mark.parametrize("reads", ["owned", "spare", "adopted"])
def test_every_reader_of_the_retry_lane_says_so_on_its_quiet_markers_partitions(
    reads: str,
) -> None:
    """Holding nothing, a consumer writes no markers: without this, a tracker hearing
    nobody could not tell an idle owner from none, and a copy left on a frozen spare
    reader's partition was never copied toward the idle owner."""
    consumer = idle_consumer()
    consumer._writer = StubMarkerWriter()
    consumer._next_announce = 0.0
    if reads == "owned":
        consumer._assigned = frozenset({0})
    elif reads == "spare":
        consumer._on_spares(frozenset({2}))
    else:
        consumer._pauses.apply(unread_key("jobs.retry", 0, "jobs"), UNREAD_VALUE)
    consumer._follow_queue_partitions()
    assert consumer._reads, "it names what it reads"
    assert announced(consumer, 10.0) == [0, 2, 3]
    assert announced(consumer, 10.3) == [], "not again within 0.4 s"
    assert announced(consumer, 10.4) == [0, 2, 3]
    assert consumer._writer.flushed == 2


def test_a_consumer_reading_nothing_of_the_retry_lane_says_nothing() -> None:
    consumer = idle_consumer()
    consumer._writer = StubMarkerWriter()
    consumer._next_announce = 0.0
    consumer._follow_queue_partitions()
    assert consumer._retry_reading == frozenset() and announced(consumer, 10.0) == []


def test_an_at_most_once_consumer_writes_no_markers_not_even_to_say_it_reads() -> None:
    consumer = idle_consumer()
    consumer._at_most_once = True
    consumer._writer = StubMarkerWriter()
    consumer._next_announce = 0.0
    consumer._assigned = frozenset({0})
    consumer._follow_queue_partitions()
    assert consumer._retry_reading and announced(consumer, 10.0) == []
