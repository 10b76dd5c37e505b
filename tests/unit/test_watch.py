"""A watched copy survives a change of tracker: the WATCH marker a redelivery round writes
(tracker.redeliver.Redeliverer, with a stub producer) anchors the watch in the state that
wrote it, and a successor that replays it watches the copy in turn
(tracker.state.PartitionState). Pure: no broker, time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.errors import KafkaConnectionError, ProducerFencedError

from kmq.markers import QUEUE_LANE, RETRY_LANE, Marker, MarkerType, decode, encode
from kmq.records import delivery_key, split_key
from tests.unit.kafka_stubs import StubTxnProducer
from tracker.redeliver import Copy, Redeliverer, RoundOutcome
from tracker.state import UNREAD_CHECKS, UNREAD_REASON, Delivery, Due, PartitionState

PARTITION = 1
LEASE_MS = 10_000
LEASE_S = LEASE_MS / 1000
UNREAD_S = 2.0
ORIGINAL: Delivery = (QUEUE_LANE, 3, 77)
COPY: Delivery = (RETRY_LANE, 5, 900)
COPY_KEY = delivery_key(*COPY)
QUEUE_TOPIC, RETRY_TOPIC, MARKER_TOPIC = "q", "q.retry", "q.markers"


def marker(
    kind: MarkerType,
    delivery: Delivery,
    *,
    attempt: int = 1,
    after_ms: int = LEASE_MS,
    max_attempts: int = 0,
) -> bytes:
    lane, partition, offset = delivery
    return encode(
        Marker(
            kind,
            partition,
            offset,
            attempt=attempt,
            redeliver_after_ms=after_ms,
            max_attempts=max_attempts,
            lane=lane,
        )
    )


def watch(copy: Delivery = COPY, queue: str = "orders", max_attempts: int = 5) -> bytes:
    """A WATCH as the tracker writes it (Redeliverer.send_watch)."""
    lane, partition, offset = copy
    return encode(
        Marker(
            MarkerType.WATCH,
            partition,
            offset,
            attempt=2,
            lane=lane,
            max_attempts=max_attempts,
            reason=queue,
        )
    )


def state(position: int = 0, end: int | None = None, unread_s: float = UNREAD_S) -> PartitionState:
    """A state that reads from ``position``, replaying up to ``end`` (none: caught up)."""
    s = PartitionState(PARTITION, unread_s=unread_s)
    s.set_position(position)
    s.set_end_offset(position if end is None else end)
    return s


def feed(s: PartitionState, value: bytes, now: float) -> int:
    offset = s.position if s.position is not None else 0
    s.on_record(offset, value, now)
    return offset


def redelivered(s: PartitionState, now: float = LEASE_S) -> Due:
    """ORIGINAL started at 0, its lease ran out, its copy (COPY) written and watched."""
    feed(s, marker(MarkerType.START, ORIGINAL, after_ms=LEASE_MS, max_attempts=5), 0)
    [due] = s.due(now)
    s.redelivered(due.key, copy=COPY_KEY, queue="orders", now=now, unread_s=UNREAD_S)
    feed(s, marker(MarkerType.REDELIVERED, ORIGINAL, attempt=2), now)
    return due


# -- the tracker that wrote it ------------------------------------------------------------------


def test_its_own_watch_read_back_holds_the_commit_point() -> None:
    s = state()
    redelivered(s)
    assert s.commit_offset() == s.position, "before its WATCH is read: as before"
    at = feed(s, watch(), LEASE_S + 0.1)
    assert s.commit_offset() == at, "a successor must replay the WATCH"
    assert (s.watched, s.in_flight, s.stats["watch"], s.stats["watch_replayed"]) == (1, 0, 1, 0)
    for _ in range(3):  # later markers of others do not move it
        feed(s, marker(MarkerType.END, (QUEUE_LANE, 0, 1)), LEASE_S + 0.2)
    assert s.commit_offset() == at


def test_taken_the_copy_holds_the_commit_point_by_its_start_then_not_at_all() -> None:
    s = state()
    redelivered(s)
    feed(s, watch(), LEASE_S + 0.1)
    taken = feed(s, marker(MarkerType.START, COPY, attempt=2, after_ms=LEASE_MS), LEASE_S + 0.5)
    assert (s.watched, s.in_flight, s.stats["unread_taken"]) == (0, 1, 1)
    assert s.commit_offset() == taken, "the WATCH lets go: the START holds it now"
    feed(s, marker(MarkerType.END, COPY), LEASE_S + 0.6)
    assert s.commit_offset() == s.position


@pytest.mark.parametrize("until_taken", [False, True], ids=["in-the-window", "on-a-spare"])
def test_a_watch_holds_the_commit_point_while_it_is_watched(until_taken: bool) -> None:
    """Looked at UNREAD_CHECKS times, a watch ends and lets go; one on a spare partition
    (``until_taken``) stays, and holds the commit point until the copy is taken."""
    s = state()
    redelivered(s)
    at = feed(s, watch(), LEASE_S + 0.1)
    now = LEASE_S + UNREAD_S
    for _ in range(UNREAD_CHECKS):
        assert s.commit_offset() == at
        [due] = s.due(now)
        assert due.start_offset == at
        s.keep_watching(due.key, now, UNREAD_S, until_taken=until_taken)
        now += UNREAD_S
    if not until_taken:
        assert (s.watched, s.stats["unread_unwatched"]) == (0, 1)
        assert s.commit_offset() == s.position
        return
    assert (s.watched, s.commit_offset(), s.stats["unread_unwatched"]) == (1, at, 0)
    taken = feed(s, marker(MarkerType.START, COPY, attempt=2), now)
    assert (s.watched, s.in_flight, s.commit_offset()) == (0, 1, taken)


def test_copied_again_its_watch_counts_as_settled_in_the_rounds_commit() -> None:
    s = state()
    redelivered(s)
    at = feed(s, watch(), LEASE_S + 0.1)
    [due] = s.due(LEASE_S + UNREAD_S)
    assert (due.key, due.unread_queue, due.start_offset) == (COPY_KEY, "orders", at)
    assert s.commit_offset([due.start_offset]) == s.position, "the round's commit skips it"
    second = delivery_key(RETRY_LANE, 6, 30)
    s.redelivered(due.key, copy=second, queue="orders", now=LEASE_S + UNREAD_S, unread_s=UNREAD_S)
    assert s.commit_offset() == s.position, "the first watch's anchor is gone"
    again = feed(s, watch((RETRY_LANE, 6, 30)), LEASE_S + UNREAD_S + 0.1)
    assert s.commit_offset() == again and s.watched == 1


def test_read_live_a_watch_of_a_copy_not_watched_is_spent() -> None:
    """Taken and acked before the WATCH was read back is impossible (consumers read copies
    committed only), but a copy no longer watched, or dropped as gone, leaves its WATCH
    behind: nothing to hold."""
    s = state()
    feed(s, watch(), 1.0)
    assert (s.watched, s.commit_offset(), s.stats["watch"]) == (0, s.position, 1)


# -- a successor replaying the partition ---------------------------------------------------------


def replayed(*records: bytes, at: float = 100.0, unread_s: float = UNREAD_S) -> PartitionState:
    """A new owner that replays ``records`` (from offset 0) and is caught up after them."""
    s = state(0, end=len(records), unread_s=unread_s)
    for i, value in enumerate(records):
        s.on_record(i, value, at + i * 0.001)
    assert not s.replaying
    return s


START = marker(MarkerType.START, ORIGINAL, after_ms=LEASE_MS, max_attempts=5)
REDELIVERED = marker(MarkerType.REDELIVERED, ORIGINAL, attempt=2)


def test_a_successor_watches_a_copy_its_predecessor_wrote() -> None:
    """The loss of chaos seed 440940772: the copy went to a spare retry partition whose
    reader had just been killed, and its markers partition changed tracker before the
    watch's first look. The new owner must look too."""
    s = replayed(START, REDELIVERED, watch())
    assert (s.watched, s.in_flight, s.stats["watch_replayed"]) == (1, 0, 1)
    assert s.commit_offset() == 2
    assert s.due(100.0 + UNREAD_S - 0.01) == []
    [due] = s.due(100.0 + UNREAD_S + 0.01)
    assert (due.key, due.unread_queue, due.attempt_step, due.max_attempts) == (
        COPY_KEY,
        "orders",
        0,
        5,
    )
    assert (due.reason, due.start_offset) == (UNREAD_REASON, 2)


def test_a_successor_does_not_watch_a_copy_taken_after_its_watch() -> None:
    taken = marker(MarkerType.START, COPY, attempt=2, after_ms=LEASE_MS)
    s = replayed(START, REDELIVERED, watch(), taken)
    assert (s.watched, s.in_flight, s.commit_offset()) == (0, 1, 3)
    s = replayed(START, REDELIVERED, watch(), taken, marker(MarkerType.END, COPY))
    assert (s.watched, s.in_flight, s.commit_offset()) == (0, 0, 5)


def test_watches_off_a_replayed_watch_is_ignored() -> None:
    s = replayed(START, REDELIVERED, watch(), unread_s=0)
    assert (s.watched, s.commit_offset(), s.stats["watch"]) == (0, 3, 1)


# -- property: no commit skips a watched copy's WATCH ----------------------------------------------

COPIES = [(RETRY_LANE, 5, n) for n in range(4)]
OPS = st.lists(
    st.tuples(st.sampled_from(["watch", "start", "end", "look", "gone"]), st.integers(0, 3)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(replay=st.integers(0, 40), ops=OPS)
def test_no_commit_skips_the_watch_of_a_copy_still_watched(
    replay: int, ops: list[tuple[str, int]]
) -> None:
    """Any interleaving of WATCH markers, the copies' STARTs and ENDs, looks at due watches
    and discards, read partly as a replay: while a copy is watched, the commit point stays
    at or before its WATCH, so whoever replays from it sees the WATCH again."""
    s = state(0, end=replay)
    written: dict[int, int] = {}  # copy key -> offset of its latest WATCH
    now = 0.0
    for op, i in ops:
        key = delivery_key(*COPIES[i])
        now += 0.5
        if op == "watch":
            written[key] = feed(s, watch(COPIES[i]), now)
        elif op in ("start", "end"):
            kind = MarkerType.START if op == "start" else MarkerType.END
            feed(s, marker(kind, COPIES[i], attempt=2, after_ms=LEASE_MS), now)
        elif op == "gone":
            s.discard(key, "record_missing")
        else:
            for due in s.due(now):
                if due.unread_queue:
                    s.keep_watching(due.key, now, UNREAD_S)
                else:
                    s.redelivered(due.key)
        held = set(s.deliveries())
        watched = [k for k in written if s.deadline_of(k) is not None and split_key(k) not in held]
        commit = s.commit_offset()
        assert commit is not None
        for k in watched:
            assert commit <= written[k], (op, i, k)
        assert s.watched == len(watched)


# -- the round that writes it ---------------------------------------------------------------------


def copy(dead_letter_queue: str | None = None, lane: int = QUEUE_LANE, offset: int = 77) -> Copy:
    due = Due(
        marker_partition=PARTITION,
        key=delivery_key(lane, 3, offset),
        start_offset=0,
        attempt_step=1,
        reason="lease expired",
        max_attempts=5,
        dead_letter_queue="",
    )
    return Copy(due, "orders", f"m-{offset}", 2, b"payload", (), dead_letter_queue)


SPARE = 9
"""A retry partition outside the queue's retry window (5, 6) that a consumer said it reads."""


def redeliverer(
    watch_copies: bool = True,
    retry: str | None = RETRY_TOPIC,
    live: frozenset[int] = frozenset({SPARE}),
) -> Redeliverer:
    """Queue window (3, 4), retry window (5, 6); by default only a spare's reader is heard,
    so copies go to the spare."""
    return Redeliverer(
        QUEUE_TOPIC,
        retry,
        MARKER_TOPIC,
        lambda topic, queue: (5, 6) if topic == RETRY_TOPIC else (3, 4),
        live=lambda queue: live,
        watch_copies=watch_copies,
    )


def test_a_round_writes_a_watch_per_copy_to_a_spare_once_the_copies_have_landed() -> None:
    txn, out = StubTxnProducer(), StubTxnProducer("copies")
    batch = [copy(offset=77), copy("orders.dlq", offset=78), copy(offset=79)]
    outcome = redeliverer().round(txn, batch, {}, None, out)
    assert outcome.written
    assert [s.partition for s in out.sent] == [SPARE, 3, SPARE]
    assert out.calls == [*["send"] * 3, "flush"], "landed before their watches are written"
    assert txn.calls == [
        "begin_transaction",
        "send",  # the fence check
        "flush",
        *["send"] * 5,  # the markers, then the watches
        "commit_transaction",
    ]
    watches = txn.sent[4:]
    landed = [p for p in outcome.placed if p is not None]
    assert len(landed) == 2, "the dead letter is not watched"
    for sent, (c, where) in zip(
        watches, [(batch[0], landed[0]), (batch[2], landed[1])], strict=True
    ):
        assert (sent.topic, sent.partition, sent.key) == (
            MARKER_TOPIC,
            PARTITION,
            c.message_id.encode(),
        )
        m = decode(sent.value)
        assert m.type is MarkerType.WATCH
        assert (m.lane, m.partition, m.offset) == (RETRY_LANE, *where)
        assert (m.attempt, m.max_attempts, m.reason) == (2, 5, "orders")


def test_what_a_round_writes_a_successor_watches() -> None:
    txn = StubTxnProducer()
    outcome = redeliverer().round(txn, [copy()], {}, None, StubTxnProducer("copies"))
    [where] = outcome.placed
    assert where is not None and where[0] == SPARE
    s = replayed(START, *(sent.value for sent in txn.sent if sent.topic == MARKER_TOPIC))
    [due] = s.due(100.0 + UNREAD_S + 0.1)
    assert (due.key, due.unread_queue) == (delivery_key(RETRY_LANE, *where), "orders")


def test_no_watches_when_off_without_a_retry_topic_or_in_the_window() -> None:
    """A copy in the queue's retry window needs none: its queue partition's next owner
    reads it whatever happens to the watch."""
    in_window = redeliverer(live=frozenset({6}))
    for r in (redeliverer(watch_copies=False), redeliverer(retry=None), in_window):
        txn, out = StubTxnProducer(), StubTxnProducer("copies")
        assert r.round(txn, [copy()], {}, None, out).written
        assert [decode(s.value).type for s in txn.sent] == [
            MarkerType.PROBE,
            MarkerType.REDELIVERED,
        ]
        assert len(out.sent) == 1


def test_a_round_whose_flush_fails_is_aborted_or_fenced() -> None:
    out = StubTxnProducer("copies")
    txn = StubTxnProducer(fail={"flush": KafkaConnectionError("down")})
    assert redeliverer().round(txn, [copy()], {}, None, out) == RoundOutcome(False)
    assert txn.calls[-1] == "abort_transaction" and "commit_transaction" not in txn.calls
    txn = StubTxnProducer(fail={"flush": ProducerFencedError()})
    assert redeliverer().round(txn, [copy()], {}, None, out) == RoundOutcome(False, fenced=True)
    assert out.sent == [], "the fence check's flush comes first: no copy went out"


def test_a_round_whose_watch_cannot_be_sent_is_aborted() -> None:
    txn = StubTxnProducer(fail_sends={2: KafkaConnectionError("down")})  # check, marker, watch
    out = StubTxnProducer("copies")
    assert redeliverer().round(txn, [copy()], {}, None, out) == RoundOutcome(False)
    assert len(out.sent) == 1, "the copy was out: a duplicate, never a loss"
    assert txn.calls[-1] == "abort_transaction"
