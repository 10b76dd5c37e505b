"""What copy a due delivery becomes (tracker.redeliver.copy_of): its attempt, or its dead
letter, from the re-read record and the START's settings; where it goes (Redeliverer.target)
and the fenced transaction that writes it (Redeliverer.round, with a stub producer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import TopicPartition
from kafka.errors import (
    InvalidProducerEpochError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFencedError,
)
from kafka.future import Future
from kafka.structs import OffsetAndMetadata

from kmq.markers import (
    MAX_ATTEMPT,
    MAX_TEXT_BYTES,
    QUEUE_LANE,
    RETRY_LANE,
    MarkerType,
    decode,
    decode_all,
    encode_entries,
    parse,
)
from kmq.policy import DEAD_LETTER_SUFFIX
from kmq.reads import READS_HEADER, encode_reads
from kmq.records import (
    ATTEMPT_HEADER,
    ID_HEADER,
    dead_letter_headers,
    delivery_key,
    queue_headers,
)
from tests.unit.kafka_stubs import StubTxnProducer
from tracker.readers import BUSY_S, FRESH_S, LATELY_S, LiveReaders
from tracker.redeliver import Copy, Redeliverer, RoundOutcome, copy_of
from tracker.reread import Record
from tracker.state import Due, PartitionState

USER = (("trace", b"t1"), ("empty", b""))


def due(
    *,
    step: int = 1,
    max_attempts: int = 0,
    dead_letter_queue: str = "",
    lane: int = QUEUE_LANE,
    partition: int = 3,
    offset: int = 77,
    reason: str = "lease expired",
) -> Due:
    return Due(
        marker_partition=1,
        key=delivery_key(lane, partition, offset),
        start_offset=9,
        attempt_step=step,
        reason=reason,
        max_attempts=max_attempts,
        dead_letter_queue=dead_letter_queue,
    )


def record(
    attempt: int = 3,
    *,
    message_id: str | None = "m-1",
    key: bytes | None = b"orders",
    value: bytes | None = b"payload",
    headers: Any = None,
) -> Record:
    if headers is None:
        headers = [*queue_headers(message_id, attempt, USER)] if message_id else list(USER)
    return Record(partition=3, offset=77, key=key, value=value, headers=tuple(headers))


# Each row: the Due, the re-read record, then the copy's (attempt, dead_letter_queue,
# destination).
CASES: dict[str, tuple[Due, Record, tuple[int, str | None, str]]] = {
    "next-attempt": (due(), record(3), (4, None, "orders")),
    "first-redelivery": (due(), record(1), (2, None, "orders")),
    "release-keeps-the-attempt": (due(step=0), record(3), (3, None, "orders")),
    "within-max-attempts": (due(max_attempts=4), record(3), (4, None, "orders")),
    "out-of-attempts-default-dlq": (
        due(max_attempts=3),
        record(3),
        (3, "orders" + DEAD_LETTER_SUFFIX, "orders.dlq"),
    ),
    "out-of-attempts-starts-own-dlq": (
        due(max_attempts=3, dead_letter_queue="parking"),
        record(3),
        (3, "parking", "parking"),
    ),
    "own-dlq-unused-while-attempts-remain": (
        due(max_attempts=9, dead_letter_queue="parking"),
        record(3),
        (4, None, "orders"),
    ),
    "release-at-the-limit-stays": (due(step=0, max_attempts=3), record(3), (3, None, "orders")),
    "release-past-a-lowered-limit": (
        due(step=0, max_attempts=2),
        record(3),
        (3, "orders.dlq", "orders.dlq"),
    ),
    "max-attempts-0-never-dead-letters": (due(), record(10_000), (10_001, None, "orders")),
    "attempt-capped-at-uint32": (due(), record(MAX_ATTEMPT), (MAX_ATTEMPT, None, "orders")),
    "huge-attempt-header-capped": (
        due(),
        record(headers=[(ID_HEADER, b"m-1"), (ATTEMPT_HEADER, b"99999999999")]),
        (MAX_ATTEMPT, None, "orders"),
    ),
    "garbage-attempt-header-is-1": (
        due(),
        record(headers=[(ID_HEADER, b"m-1"), (ATTEMPT_HEADER, b"lots")]),
        (2, None, "orders"),
    ),
    "dead-letter-of-a-dead-letter": (
        due(max_attempts=1),
        record(1, key=b"orders.dlq"),
        (1, "orders.dlq.dlq", "orders.dlq.dlq"),
    ),
}


@pytest.mark.parametrize(("d", "rec", "expected"), CASES.values(), ids=CASES.keys())
def test_copy_of(d: Due, rec: Record, expected: tuple[int, str | None, str]) -> None:
    copy = copy_of(d, rec)
    assert (copy.attempt, copy.dead_letter_queue, copy.destination) == expected
    assert copy.due is d
    assert copy.queue == (rec.key or b"").decode()


def test_the_copy_keeps_id_payload_and_user_headers() -> None:
    copy = copy_of(due(), record(3))
    assert (copy.message_id, copy.payload, copy.headers) == ("m-1", b"payload", USER)


@pytest.mark.parametrize(
    ("lane", "partition", "offset"), [(QUEUE_LANE, 3, 77), (RETRY_LANE, 0, 2**44 - 1)]
)
def test_a_record_without_an_id_gets_one_from_where_it_was(
    lane: int, partition: int, offset: int
) -> None:
    copy = copy_of(due(lane=lane, partition=partition, offset=offset), record(message_id=None))
    assert copy.message_id == f"ext-{partition}-{offset}"
    assert (copy.attempt, copy.headers) == (2, USER)


@pytest.mark.parametrize("headers", [(), ((ID_HEADER, b""),), ((ID_HEADER, None),)])
def test_an_empty_id_counts_as_missing(headers: tuple[tuple[str, bytes | None], ...]) -> None:
    assert copy_of(due(), record(headers=headers)).message_id == "ext-3-77"


def test_missing_key_and_value() -> None:
    copy = copy_of(due(max_attempts=1), record(1, key=None, value=None))
    assert (copy.queue, copy.payload) == ("", b"")
    assert copy.dead_letter_queue == DEAD_LETTER_SUFFIX


@settings(max_examples=300, deadline=None)
@given(
    attempt=st.integers(1, MAX_ATTEMPT),
    step=st.sampled_from([0, 1]),
    max_attempts=st.integers(0, MAX_ATTEMPT),
    own=st.sampled_from(["", "parking"]),
)
def test_copy_rules(attempt: int, step: int, max_attempts: int, own: str) -> None:
    copy = copy_of(
        due(step=step, max_attempts=max_attempts, dead_letter_queue=own), record(attempt)
    )
    out = 0 < max_attempts < attempt + step
    if out:
        assert copy.dead_letter_queue == (own or "orders.dlq")
        assert copy.attempt == attempt, "a dead letter keeps the attempts it had"
    else:
        assert copy.dead_letter_queue is None and copy.destination == "orders"
        assert copy.attempt == min(attempt + step, MAX_ATTEMPT)
    assert 1 <= copy.attempt <= MAX_ATTEMPT


# -- Redeliverer.target: where a copy or dead letter goes -------------------------------------

QUEUE_TOPIC, RETRY_TOPIC, MARKER_TOPIC = "q.topic", "q.topic.retry", "q.markers"
LAYOUTS: dict[tuple[str, str], tuple[int, ...]] = {
    (RETRY_TOPIC, "orders"): (2, 3, 4),
    (QUEUE_TOPIC, "orders"): (5, 6),
    (QUEUE_TOPIC, "orders.dlq"): (0, 1, 3),
    (QUEUE_TOPIC, "parking"): (7,),
}


class Layouts:
    """``partitions(topic, queue)`` for a Redeliverer; records what it was asked."""

    def __init__(self, table: dict[tuple[str, str], tuple[int, ...]] | None = None) -> None:
        self.table = LAYOUTS if table is None else table
        self.asked: list[tuple[str, str]] = []

    def __call__(self, topic: str, queue: str) -> tuple[int, ...]:
        self.asked.append((topic, queue))
        return self.table[(topic, queue)]


def redeliverer(layouts: Layouts | None = None, *, retry: bool = True) -> Redeliverer:
    return Redeliverer(
        QUEUE_TOPIC, RETRY_TOPIC if retry else None, MARKER_TOPIC, layouts or Layouts()
    )


def a_copy(
    lane: int = QUEUE_LANE,
    partition: int = 3,
    offset: int = 77,
    *,
    max_attempts: int = 0,
    dead_letter_queue: str = "",
    reason: str = "lease expired",
    attempt: int = 3,
) -> Copy:
    d = due(
        lane=lane,
        partition=partition,
        offset=offset,
        max_attempts=max_attempts,
        dead_letter_queue=dead_letter_queue,
        reason=reason,
    )
    return copy_of(d, record(attempt))


# Each row: the copy, the retry topic on or off, then (topic, partition). The queue "orders"
# is on queue partitions (5, 6) and retry partitions (2, 3, 4): by kmq.layout.mirrored, the
# reader of 5 reads 2 and 4, the reader of 6 reads 3. A copy goes to the other reader's.
TARGETS: dict[str, tuple[Copy, bool, tuple[str, int]]] = {
    "copy-of-queue-partition-5-to-the-reader-of-6": (a_copy(QUEUE_LANE, 5, 77), True,
                                                     (RETRY_TOPIC, 3)),
    "copy-of-queue-partition-6-to-the-reader-of-5": (a_copy(QUEUE_LANE, 6, 77), True,
                                                     (RETRY_TOPIC, 2)),
    "queue-lane-copy-outside-the-layout-by-offset": (a_copy(QUEUE_LANE, 3, 77), True,
                                                     (RETRY_TOPIC, (2, 3, 4)[77 % 3])),
    "retry-lane-copy-of-4-to-the-reader-of-6": (a_copy(RETRY_LANE, 4, 77), True,
                                                (RETRY_TOPIC, 3)),
    "retry-lane-copy-of-3-to-the-reader-of-5": (a_copy(RETRY_LANE, 3, 77), True,
                                                (RETRY_TOPIC, 2)),
    "retry-lane-copy-outside-the-layout-moves": (a_copy(RETRY_LANE, 9, 10), True,
                                                 (RETRY_TOPIC, (2, 3, 4)[10 % 3])),
    "dead-letter-to-queue-topic-by-offset": (a_copy(RETRY_LANE, 1, 8, max_attempts=3), True,
                                             (QUEUE_TOPIC, (0, 1, 3)[8 % 3])),
    "dead-letter-of-a-queue-record-in-the-dlq-layout-stays": (
        a_copy(QUEUE_LANE, 1, 8, max_attempts=3), True, (QUEUE_TOPIC, 1)),
    "dead-letter-of-a-queue-record-outside-the-dlq-layout": (
        a_copy(QUEUE_LANE, 2, 8, max_attempts=3), True, (QUEUE_TOPIC, (0, 1, 3)[8 % 3])),
    "dead-letter-to-its-own-queue": (
        a_copy(QUEUE_LANE, 5, 1234, max_attempts=3, dead_letter_queue="parking"), True,
        (QUEUE_TOPIC, 7)),
    "no-retry-topic-copy-goes-to-queue-topic": (a_copy(QUEUE_LANE, 9, 11), False,
                                                (QUEUE_TOPIC, (5, 6)[11 % 2])),
    "no-retry-topic-queue-record-stays": (a_copy(QUEUE_LANE, 6, 11), False, (QUEUE_TOPIC, 6)),
}  # fmt: skip


@pytest.mark.parametrize(("copy", "retry", "expected"), TARGETS.values(), ids=TARGETS.keys())
def test_target(copy: Copy, retry: bool, expected: tuple[str, int]) -> None:
    layouts = Layouts()
    assert redeliverer(layouts, retry=retry).target(copy) == expected
    assert {t for t, _ in layouts.asked} <= {QUEUE_TOPIC, RETRY_TOPIC}
    assert {q for _, q in layouts.asked} == {copy.destination}, "the destination's layouts"


@settings(max_examples=300, deadline=None)
@given(
    lane=st.sampled_from([QUEUE_LANE, RETRY_LANE]),
    partition=st.integers(0, 2**15 - 1),
    offset=st.integers(0, 2**44 - 1),
    dead=st.booleans(),
    retry=st.booleans(),
    choices=st.lists(st.integers(0, 50), min_size=1, max_size=8, unique=True).map(tuple),
)
def test_target_rules(
    lane: int,
    partition: int,
    offset: int,
    dead: bool,
    retry: bool,
    choices: tuple[int, ...],
) -> None:
    copy = a_copy(lane, partition, offset, max_attempts=3 if dead else 0)
    topic, chosen = Redeliverer(
        QUEUE_TOPIC, RETRY_TOPIC if retry else None, MARKER_TOPIC, lambda t, q: choices
    ).target(copy)
    to_retry = retry and not dead
    assert topic == (RETRY_TOPIC if to_retry else QUEUE_TOPIC)
    assert chosen in choices
    same_topic = lane == (RETRY_LANE if to_retry else QUEUE_LANE)
    if to_retry and partition in choices and len(choices) > 1:
        # Both windows are ``choices`` here: the copy goes to the next partition's reader.
        assert chosen == choices[(choices.index(partition) + 1) % len(choices)] != partition
    elif same_topic and partition in choices:
        assert chosen == partition
    else:
        assert chosen == choices[offset % len(choices)]


def windowed(
    live: set[int], lately: set[int] | None = None, busy: set[int] | None = None
) -> Redeliverer:
    """Queue window (5, 6, 7), retry window (2, 3, 4); ``live``, ``lately`` and ``busy``
    (none if ``None``) what consumers of queue "orders" said they read."""
    return Redeliverer(
        QUEUE_TOPIC,
        RETRY_TOPIC,
        MARKER_TOPIC,
        lambda topic, queue: (5, 6, 7) if topic == QUEUE_TOPIC else (2, 3, 4),
        live=lambda queue: live if queue == "orders" else set(),
        lately=lambda queue: lately if lately is not None and queue == "orders" else set(),
        busy=lambda queue: busy if busy is not None and queue == "orders" else set(),
    )


def test_a_copy_goes_to_a_partition_a_consumer_said_it_reads() -> None:
    """Queue window (5, 6, 7), retry window (2, 3, 4): a copy of a record read from queue
    partition 5 goes with 6 (retry partition 3) unless only 7's (4) is read lately."""
    live: set[int] = set()
    r = windowed(live)
    copy = a_copy(QUEUE_LANE, 5, 77)
    assert r.target(copy) == (RETRY_TOPIC, 3), "nobody said anything: the usual choice"
    live.update({3, 4})
    assert r.target(copy) == (RETRY_TOPIC, 3)
    live.discard(3)  # the consumer reading 3 fell silent (killed with the holder, say)
    assert r.target(copy) == (RETRY_TOPIC, 4)
    live.clear()
    live.add(2)  # only the holder's own: no better than the usual choice
    assert r.target(copy) == (RETRY_TOPIC, 3)


def test_a_partition_said_most_lately_goes_first() -> None:
    """Retry partition 3 (the usual choice) was said within a second, but not lately: its
    reader may have been killed a moment ago, while 4's reader has just said so."""
    lately: set[int] = set()
    r = windowed({3, 4}, lately)
    copy = a_copy(QUEUE_LANE, 5, 77)
    assert r.target(copy) == (RETRY_TOPIC, 3), "nobody said so lately: as before"
    lately.add(4)
    assert r.target(copy) == (RETRY_TOPIC, 4)
    lately.add(3)
    assert r.target(copy) == (RETRY_TOPIC, 3), "both said lately: the usual choice"
    lately.clear()
    lately.add(2)  # only the holder's own lately: the others said within a second count
    assert r.target(copy) == (RETRY_TOPIC, 3)


def test_a_partition_said_within_a_busy_readers_interval_goes_before_one_said_lately() -> None:
    """Retry partition 3 (the usual choice) and 4 were both said lately, but only 4 within a
    busy reader's interval: 3's reader, killed a moment ago, still counts as said lately."""
    busy: set[int] = set()
    r = windowed({3, 4}, {3, 4}, busy)
    copy = a_copy(QUEUE_LANE, 5, 77)
    assert r.target(copy) == (RETRY_TOPIC, 3), "nobody that recently: as before"
    busy.add(4)
    assert r.target(copy) == (RETRY_TOPIC, 4)
    busy.add(3)
    assert r.target(copy) == (RETRY_TOPIC, 3), "both that recently: the usual choice"
    busy.clear()
    busy.add(2)  # only the holder's own: the lately tier decides
    assert r.target(copy) == (RETRY_TOPIC, 3)


def test_busy_readers_are_those_said_within_the_shortest_interval() -> None:
    """The tiers' intervals nest (busy within lately within fresh), and a reader said
    longer than a busy reader's interval ago drops out of the first tier only."""
    assert 0 < BUSY_S < LATELY_S < FRESH_S
    readers = LiveReaders()
    readers.note([(READS_HEADER, encode_reads("orders", {3}))], 10.2)
    readers.note([(READS_HEADER, encode_reads("orders", {4}))], 10.5)
    now = 10.5 + BUSY_S / 2
    assert readers.live("orders", now, BUSY_S) == {4}
    assert readers.live("orders", now, LATELY_S) == {3, 4}


# -- Redeliverer.round: the copies first, then their markers in one transaction -------------

GROUP_METADATA = object()
OFFSETS = {TopicPartition(MARKER_TOPIC, 1): OffsetAndMetadata(42, "", -1)}


def copies() -> list[Copy]:
    """A copy of a queue record, a copy of a retry record and a dead letter."""
    return [
        a_copy(QUEUE_LANE, 3, 77, reason="lease expired"),
        a_copy(RETRY_LANE, 4, 78, reason="nacked"),
        a_copy(QUEUE_LANE, 5, 79, max_attempts=3, reason="poison"),
    ]


def run_round(
    txn: StubTxnProducer,
    batch: list[Copy],
    offsets: Mapping[TopicPartition, OffsetAndMetadata] = OFFSETS,
    out: StubTxnProducer | None = None,
    r: Redeliverer | None = None,
) -> tuple[RoundOutcome, StubTxnProducer]:
    """The round's outcome, and the producer its copies went through."""
    out = StubTxnProducer("copies") if out is None else out
    return (r or redeliverer()).round(txn, batch, offsets, GROUP_METADATA, out), out


def test_a_round_writes_copies_then_markers_and_the_offset_commit() -> None:
    txn = StubTxnProducer()
    batch = copies()
    outcome, out = run_round(txn, batch)
    assert outcome == RoundOutcome(True) and (outcome.written, outcome.fenced) == (True, False)
    assert txn.calls == [
        "begin_transaction",
        "send",
        "flush",  # the fence check is through before any copy goes out
        *["send"] * 3,
        "send_offsets_to_transaction",
        "commit_transaction",
    ]
    assert out.calls == [*["send"] * 3, "flush"], "every copy is on the broker before its marker"
    fence, *markers = txn.sent
    assert (fence.topic, fence.partition) == (MARKER_TOPIC, 1)
    assert [m.type for m in decode_all(fence.value)] == [MarkerType.PROBE]
    assert decode_all(fence.value)[0].attempt == 0, "no tracker's probe: it changes nothing"
    assert txn.offsets == [(OFFSETS, GROUP_METADATA)]
    assert [(s.topic, s.partition, s.key) for s in out.sent] == [
        (RETRY_TOPIC, (2, 3, 4)[77 % 3], b"orders"),
        (RETRY_TOPIC, 3, b"orders"),  # read with queue partition 6, not 5 like 4
        (QUEUE_TOPIC, (0, 1, 3)[79 % 3], b"orders.dlq"),
    ]
    assert [s.value for s in out.sent] == [b"payload"] * 3
    assert [s.headers for s in out.sent] == [
        queue_headers("m-1", 4, USER),
        queue_headers("m-1", 4, USER),
        dead_letter_headers("m-1", "orders", 3, "poison", USER),
    ]
    for copy, sent in zip(batch, markers, strict=True):
        assert (sent.topic, sent.partition, sent.key) == (MARKER_TOPIC, 1, b"m-1")
        assert sent.headers is None
        m = decode(sent.value)
        dead = copy.dead_letter_queue is not None
        assert m.type is (MarkerType.DEAD_LETTERED if dead else MarkerType.REDELIVERED)
        assert (m.lane, m.partition, m.offset) == copy.due.delivery
        assert (m.attempt, m.reason) == (copy.attempt, copy.due.reason)
        assert (m.redeliver_after_ms, m.max_attempts) == (0, 0)


def test_every_copy_is_on_the_broker_before_any_marker_is_written() -> None:
    """The embedded broker shows an aborted transaction's markers: a marker written before
    its copy was acknowledged could name a copy that never existed (chaos run 69)."""
    log: list[str] = []

    class Logged(StubTxnProducer):
        def send(self, topic: str, **kwargs: Any) -> Future:
            log.append(f"{self.transactional_id}:send:{topic}")
            return super().send(topic, **kwargs)

        def flush(self, timeout: float | None = None) -> None:
            log.append(f"{self.transactional_id}:flush")
            super().flush(timeout)

    outcome, _ = run_round(Logged("txn"), copies(), out=Logged("copies"))
    assert outcome.written
    markers = [i for i, e in enumerate(log) if e == f"txn:send:{MARKER_TOPIC}"]
    copy_sends = [i for i, e in enumerate(log) if e.startswith("copies:send")]
    assert len(markers) == 4 and len(copy_sends) == 3
    assert log[markers[0] + 1] == "txn:flush" and markers[0] < copy_sends[0], "fence check first"
    copies_flushed = log.index("copies:flush")
    assert max(copy_sends) < copies_flushed < min(markers[1:])


def test_the_transaction_writes_to_its_markers_partition_only() -> None:
    """No two replicas' transactions share a partition (the embedded broker can leave two
    that do, ended at once, unfinished: chaos run 67)."""
    txn = StubTxnProducer()
    r = Redeliverer(QUEUE_TOPIC, RETRY_TOPIC, MARKER_TOPIC, Layouts(), watch_copies=True)
    outcome, _ = run_round(txn, copies(), r=r)
    assert outcome.written
    assert {(s.topic, s.partition) for s in txn.sent} == {(MARKER_TOPIC, 1)}


def test_markers_go_to_the_partition_of_the_start() -> None:
    txn = StubTxnProducer()
    copy = a_copy()
    moved = replace(copy, due=replace(copy.due, marker_partition=6))
    assert run_round(txn, [moved], {})[0].written
    assert {(s.topic, s.partition) for s in txn.sent} == {(MARKER_TOPIC, 6)}


def test_a_marker_without_a_reason_has_no_text() -> None:
    txn = StubTxnProducer()
    assert run_round(txn, [a_copy(reason="")], {})[0].written
    assert decode(txn.sent[1].value).reason == ""
    assert parse(txn.sent[1].value)[0][0][7] == 0


def test_without_offsets_nothing_is_committed_to_the_group() -> None:
    txn = StubTxnProducer()
    assert run_round(txn, [a_copy()], {})[0] == RoundOutcome(True)
    assert "send_offsets_to_transaction" not in txn.calls and txn.offsets == []
    assert txn.calls[-1] == "commit_transaction"


def test_an_empty_round_still_commits_the_offsets() -> None:
    txn = StubTxnProducer()
    outcome, out = run_round(txn, [])
    assert outcome == RoundOutcome(True)
    assert txn.sent == [] and out.calls == [] and txn.offsets == [(OFFSETS, GROUP_METADATA)]


def test_a_copy_the_broker_placed_at_no_offset_is_written_again_once() -> None:
    """A retried write found already written is answered with offset -1: that copy could
    not be watched, so it is written once more, before any marker, and the second write is
    the one reported (and watched); dead letters are not watched, so not written again."""
    txn = StubTxnProducer()
    out = StubTxnProducer("copies", unplaced=frozenset({0, 2}))  # a copy and the dead letter
    outcome, _ = run_round(txn, copies(), out=out)
    assert outcome.written
    assert out.calls == [*["send"] * 3, "flush", "send", "flush"], "written again, then flushed"
    first, again = out.sent[0], out.sent[3]
    assert (again.topic, again.partition, again.value, again.headers) == (
        first.topic, first.partition, first.value, first.headers
    ), "the same copy, to the same partition"
    assert outcome.placed == ((first.partition, 1), (3, 0), None)
    assert outcome.written_again == 1
    assert len(txn.sent) == 1 + 3, "the fence check and one marker per copy, as before"


def test_a_copy_placed_at_no_offset_twice_stays_unwatched() -> None:
    out = StubTxnProducer("copies", unplaced=frozenset({0, 1}))
    outcome, _ = run_round(StubTxnProducer(), [a_copy()], {}, out=out)
    assert outcome.written and outcome.placed == (None,) and outcome.written_again == 1
    assert out.calls.count("send") == 2, "written again once, not a third time"


def test_a_copy_written_again_fails_the_round_if_that_write_fails() -> None:
    """Its marker is never written without the copy the round reports."""
    out = StubTxnProducer(
        "copies", unplaced=frozenset({0}), fail_futures={1: KafkaTimeoutError("slow")}
    )
    txn = StubTxnProducer()
    outcome, _ = run_round(txn, [a_copy()], out=out)
    assert outcome == RoundOutcome(False) and txn.calls[-1] == "abort_transaction"
    assert [m.type for s in txn.sent for m in decode_all(s.value)] == [MarkerType.PROBE]


def test_the_watch_of_a_copy_on_a_spare_names_where_the_second_write_landed() -> None:
    """Queue window (5, 6, 7) on retry partitions (2, 3, 4); the queue's readers say they
    read only retry partition 9, a spare: the copy goes there, and its WATCH marker names
    the write that was placed."""
    r = Redeliverer(
        QUEUE_TOPIC,
        RETRY_TOPIC,
        MARKER_TOPIC,
        lambda topic, queue: (5, 6, 7) if topic == QUEUE_TOPIC else (2, 3, 4),
        live=lambda queue: {9},
        watch_copies=True,
    )
    copy = a_copy(QUEUE_LANE, 5, 77)
    assert r.target(copy) == (RETRY_TOPIC, 9)
    txn = StubTxnProducer()
    out = StubTxnProducer("copies", unplaced=frozenset({0}))
    outcome, _ = run_round(txn, [copy], {}, out=out, r=r)
    assert outcome.written and outcome.placed == ((9, 1),)
    watches = [m for s in txn.sent for m in decode_all(s.value) if m.type is MarkerType.WATCH]
    assert [(w.lane, w.partition, w.offset) for w in watches] == [(RETRY_LANE, 9, 1)]


# Where the transaction fails: a method name, the index of the send that raises, or
# ("future", index): the send whose future fails (kafka-python's way for a fenced produce).
FAILURE_POINTS: dict[str, str | int | tuple[str, int]] = {
    "begin": "begin_transaction",
    "fence-check": 0,
    "fence-refused": ("future", 0),
    "fence-flush": "flush",
    "first-marker": 1,
    "last-marker": 3,
    "send-offsets": "send_offsets_to_transaction",
    "commit": "commit_transaction",
}


def failing(point: str | int | tuple[str, int], exc: BaseException) -> StubTxnProducer:
    if isinstance(point, tuple):
        return StubTxnProducer(fail_futures={point[1]: exc})
    if isinstance(point, int):
        return StubTxnProducer(fail_sends={point: exc})
    return StubTxnProducer(fail={point: exc})


@pytest.mark.parametrize("point", FAILURE_POINTS.values(), ids=FAILURE_POINTS.keys())
@pytest.mark.parametrize(
    "exc", [ProducerFencedError(), InvalidProducerEpochError()], ids=["fenced", "epoch"]
)
def test_a_fenced_round_reports_fenced(
    point: str | int | tuple[str, int], exc: KafkaError
) -> None:
    txn = failing(point, exc)
    outcome, out = run_round(txn, copies())
    assert outcome == RoundOutcome(False, fenced=True)
    assert not outcome.written
    if point not in ("commit_transaction", "send_offsets_to_transaction"):
        assert "commit_transaction" not in txn.calls
    if point in ("begin_transaction", 0, ("future", 0), "flush"):
        assert out.sent == [], "a fenced replica sends no copy"


@pytest.mark.parametrize("point", FAILURE_POINTS.values(), ids=FAILURE_POINTS.keys())
@pytest.mark.parametrize(
    "exc",
    [KafkaTimeoutError("slow"), MessageSizeTooLargeError("big"), KafkaConnectionError("down")],
    ids=["timeout", "too-large", "connection"],
)
def test_a_failed_round_is_aborted(point: str | int | tuple[str, int], exc: KafkaError) -> None:
    if point == "flush" and isinstance(exc, KafkaTimeoutError):
        # The fence check's flush timing out gives the producer up instead (the next test).
        exc = KafkaError("flush failed")
    txn = failing(point, exc)
    outcome, _ = run_round(txn, copies())
    assert outcome == RoundOutcome(False) and not outcome.fenced
    assert txn.calls.count("abort_transaction") == 1
    assert txn.calls[-1] == "abort_transaction"
    if point != "commit_transaction":
        assert "commit_transaction" not in txn.calls


class SlowFenceCheck(StubTxnProducer):
    """A transactional producer whose fence check is never answered: its flush times out
    (kafka-python's way) or returns with the check's future still pending."""

    def __init__(self, flush_raises: bool) -> None:
        super().__init__()
        self.flush_raises = flush_raises
        self.flush_timeouts: list[float | None] = []

    def send(self, topic: str, **kwargs: Any) -> Future:
        super().send(topic, **kwargs)
        return Future()  # never done

    def flush(self, timeout: float | None = None) -> None:
        self.flush_timeouts.append(timeout)
        super().flush(timeout)
        if self.flush_raises:
            raise KafkaTimeoutError("Timeout waiting for future")


@pytest.mark.parametrize("flush_raises", [True, False], ids=["flush-times-out", "still-pending"])
def test_a_fence_check_not_answered_in_time_gives_the_producer_up(flush_raises: bool) -> None:
    """Stuck after the fence-check bound, not the round's: nothing is out yet, so the
    replica drops the producer and claims the partition again, with no abort to wait for."""
    txn = SlowFenceCheck(flush_raises)
    r = Redeliverer(
        QUEUE_TOPIC, RETRY_TOPIC, MARKER_TOPIC, Layouts(), txn_timeout_s=10.0,
        fence_check_timeout_s=0.25,
    )  # fmt: skip
    outcome, out = run_round(txn, copies(), r=r)
    assert outcome == RoundOutcome(False, stuck=True) and not outcome.written
    assert txn.flush_timeouts == [0.25]
    assert out.sent == [] and out.calls == [], "no copy goes out"
    assert txn.calls == ["begin_transaction", "send", "flush"], "no marker, commit or abort"


@pytest.mark.parametrize(
    "out",
    [
        StubTxnProducer("copies", fail_sends={1: KafkaTimeoutError("slow")}),
        StubTxnProducer("copies", fail_futures={2: MessageSizeTooLargeError("big")}),
        StubTxnProducer("copies", fail={"flush": KafkaTimeoutError("slow")}),
    ],
    ids=["send", "refused", "flush"],
)
def test_a_copy_that_fails_aborts_the_round_and_commits_nothing(out: StubTxnProducer) -> None:
    """Its markers are never written without it; copies already out are duplicates."""
    txn = StubTxnProducer()
    outcome, _ = run_round(txn, copies(), out=out)
    assert outcome == RoundOutcome(False)
    assert txn.calls[-1] == "abort_transaction" and "commit_transaction" not in txn.calls
    assert [m.type for s in txn.sent for m in decode_all(s.value)] == [MarkerType.PROBE]


def test_a_copy_not_answered_after_the_flush_fails_the_round() -> None:
    """A marker is never committed without its copy on the broker."""

    class Unanswered(StubTxnProducer):
        def send(self, topic: str, **kwargs: Any) -> Future:
            super().send(topic, **kwargs)
            return Future()  # never done

    txn = StubTxnProducer()
    outcome, _ = run_round(txn, copies(), out=Unanswered("copies"))
    assert outcome == RoundOutcome(False)
    assert "commit_transaction" not in txn.calls and txn.calls[-1] == "abort_transaction"
    assert len(txn.sent) == 1, "no marker went out, only the fence check"


def test_a_failing_abort_still_reports_a_failed_round() -> None:
    txn = StubTxnProducer(
        fail={"commit_transaction": KafkaTimeoutError("x"), "abort_transaction": KafkaError("y")}
    )
    assert run_round(txn, copies())[0] == RoundOutcome(False)
    assert txn.calls[-1] == "abort_transaction"


def test_a_layout_that_cannot_be_read_fails_the_round() -> None:
    def no_layout(topic: str, queue: str) -> tuple[int, ...]:
        raise KafkaError(f"topic {topic} has no partitions")

    txn = StubTxnProducer()
    r = Redeliverer(QUEUE_TOPIC, RETRY_TOPIC, MARKER_TOPIC, no_layout)
    outcome, out = run_round(txn, copies(), r=r)
    assert outcome == RoundOutcome(False) and out.sent == []
    assert txn.calls[-1] == "abort_transaction" and "commit_transaction" not in txn.calls


@pytest.mark.parametrize(
    "reason",
    [
        "é" * 40_000,  # valid UTF-8, 80,000 bytes: a version 1 NACK's reason, say
        "\ufffd" * 30_000,  # what 30,000 bytes of bad UTF-8 in a version 2 reason read as
        "x" * (MAX_TEXT_BYTES + 1),
    ],
    ids=["two-byte-chars", "replacement-chars", "ascii-one-over"],
)
def test_a_reason_too_long_for_a_marker_is_cut_not_fatal(reason: str) -> None:
    txn = StubTxnProducer()
    outcome, _ = run_round(txn, [a_copy(reason=reason)], {})
    assert outcome == RoundOutcome(True)
    text = decode(txn.sent[1].value).reason
    assert reason.startswith(text) and 0 < len(text.encode()) <= MAX_TEXT_BYTES
    assert len(text.encode()) > MAX_TEXT_BYTES - 4, "cut at a character boundary, no sooner"


def test_a_bad_utf8_reason_read_by_the_state_is_redelivered() -> None:
    """End to end from the markers: 30,000 bytes that are not UTF-8 read back as 90,000."""
    state = PartitionState(1)
    state.set_position(0)
    state.set_end_offset(0)
    state.on_record(0, encode_entries([(1, QUEUE_LANE, 3, 77, 1, 1000, 0, 0)], []), 0.0)
    bad = b"\xff" * 30_000
    state.on_record(1, encode_entries([(4, QUEUE_LANE, 3, 77, 1, 0, 0, len(bad))], [bad]), 0.0)
    [d] = state.due(1.0)
    txn = StubTxnProducer()
    assert run_round(txn, [copy_of(d, record(1))], {})[0].written
    assert set(decode(txn.sent[1].value).reason) == {"\ufffd"}
