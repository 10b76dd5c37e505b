"""MarkerWriter: the background flusher, one record per markers partition per flush, chunks
under the size budget, Flush tickets, and what a failing send leaves behind."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from kafka.future import Future

from kmq.marker_writer import Flush, MarkerWriter, marker_partition
from kmq.markers import ENTRY_BYTES, HEADER_BYTES, Entry, MarkerType, parse

WAIT_S = 5.0
LONG_LINGER_S = 3600.0  # never reached: only flush_soon, flush_at or close send


class StubProducer:
    """Records each send. Refuses values over ``limit`` bytes and any partition in
    ``refuse``, as kafka-python refuses a record before sending it. Futures succeed at once
    unless ``hold`` is set; held ones wait in ``futures`` for the test to settle them."""

    def __init__(
        self, limit: int = 1_000_000, refuse: frozenset[int] = frozenset(), hold: bool = False
    ) -> None:
        self.limit = limit
        self.refuse = refuse
        self.hold = hold
        self.sent: list[tuple[int, bytes]] = []
        self.headers: list[list[tuple[str, bytes]] | None] = []
        self.futures: list[Future] = []
        self.gate: threading.Event | None = None  # set: send() blocks until it is set
        self.sending = threading.Event()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes,
        partition: int,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Future:
        assert topic == "markers" and key is None
        self.sending.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        if len(value) > self.limit:
            raise MessageSizeTooLargeError(f"{len(value)} bytes")
        if partition in self.refuse:
            raise KafkaTimeoutError("buffer full")
        future = Future()
        with self.changed:
            self.sent.append((partition, value))
            self.headers.append(headers)
            if self.hold:
                self.futures.append(future)
            self.changed.notify_all()
        if not self.hold:
            future.success(None)
        return future

    def wait_sent(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.sent) >= count, WAIT_S)

    def records(self) -> list[tuple[int, list[Entry], list[bytes]]]:
        with self.lock:
            return [(p, *parse(v)) for p, v in self.sent]


def entry(kind: MarkerType, offset: int, text: bytes = b"") -> Entry:
    return (int(kind), 0, 0, offset, 1, 1000, 0, len(text))


S, E, N = MarkerType.START, MarkerType.END, MarkerType.NACK


@pytest.fixture
def writers() -> Iterator[list[MarkerWriter]]:
    """Writers made in a test, closed after it (their threads must not outlive it)."""
    made: list[MarkerWriter] = []
    yield made
    for w in made:
        w.close(WAIT_S)


def make(
    writers: list[MarkerWriter],
    producer: StubProducer,
    *,
    partitions: int = 4,
    max_record_bytes: int = 1_000_000,
    linger_s: float = LONG_LINGER_S,
    flush_at: int = 10_000,
) -> MarkerWriter:
    writer = MarkerWriter(
        producer, "markers", partitions, max_record_bytes, linger_s=linger_s, flush_at=flush_at
    )
    writers.append(writer)
    return writer


def test_marker_partition_is_crc32_of_the_message_id() -> None:
    for message_id in ("a", "0123456789abcdef0123456789abcdef", "π"):
        assert marker_partition(message_id, 7) == zlib.crc32(message_id.encode()) % 7
    assert marker_partition("a", 4) == 3  # pinned: moving it would split a message's markers


def test_markers_go_out_per_partition_in_order_one_record_each(
    writers: list[MarkerWriter],
) -> None:
    producer = StubProducer()
    writer = make(writers, producer)
    assert writer.partition_for("a") == marker_partition("a", 4)
    adds = [
        (entry(S, 1), 0, b""),
        (entry(S, 2), 1, b""),
        (entry(N, 1, b"why"), 0, b"why"),
        (entry(E, 2), 1, b""),
        (entry(S, 3), 0, b""),
    ]
    flushes = [writer.add(e, p, t) for e, p, t in adds]
    assert len({id(f) for f in flushes}) == 1, "all of it rides in one flush"
    assert writer.pending == 5
    flush = flushes[0]
    writer.flush_soon()
    assert flush.wait(WAIT_S)
    assert flush.errors == {} and flush.error(0) is None
    assert writer.pending == 0
    assert sorted(producer.records()) == [
        (0, [entry(S, 1), entry(N, 1, b"why"), entry(S, 3)], [b"", b"why", b""]),
        (1, [entry(S, 2), entry(E, 2)], [b"", b""]),
    ]


def test_every_record_of_a_flush_carries_the_headers_asked_for_then(
    writers: list[MarkerWriter],
) -> None:
    producer = StubProducer()
    said: list[list[tuple[str, bytes]]] = [[]]
    writer = MarkerWriter(
        producer, "markers", 4, 1_000_000, linger_s=LONG_LINGER_S, headers=lambda: said[0]
    )
    writers.append(writer)
    writer.add(entry(S, 1), 0)
    assert writer.sync(WAIT_S)
    said[0] = [("kmq.reads", b"orders 3")]
    writer.add_many([(entry(S, 2), 0), (entry(S, 3), 1)])
    assert writer.sync(WAIT_S)
    reads = [("kmq.reads", b"orders 3")]
    assert producer.headers == [None, reads, reads], "none while there is nothing to say"


def test_quiet_partitions_are_those_no_record_went_to_since(writers: list[MarkerWriter]) -> None:
    writer = make(writers, StubProducer())
    before = time.monotonic()
    assert writer.quiet_partitions(before) == [0, 1, 2, 3], "nothing written yet"
    writer.add_many([(entry(S, 1), 1), (entry(S, 2), 3)])
    assert writer.quiet_partitions(before) == [0, 1, 2, 3], "queued is not sent"
    assert writer.sync(WAIT_S)
    assert writer.quiet_partitions(before) == [0, 2]
    assert writer.quiet_partitions(time.monotonic() + 1) == [0, 1, 2, 3]


def test_add_many_keeps_order_across_partitions(writers: list[MarkerWriter]) -> None:
    producer = StubProducer()
    writer = make(writers, producer)
    items = [(entry(S, i), i % 3) for i in range(30)]
    flush = writer.add_many(items)
    writer.flush_soon()
    assert flush.wait(WAIT_S) and not flush.errors
    by_partition = {p: entries for p, entries, _ in producer.records()}
    assert by_partition == {p: [e for e, q in items if q == p] for p in range(3)}


def test_add_many_with_a_text_puts_every_entry_in_the_one_flush_it_returns(
    writers: list[MarkerWriter],
) -> None:
    # A queue with its own dead-letter queue names it in every START. The batch waits for
    # one flush, so every START must ride in it (one add() each could straddle two flushes,
    # and the batch would be handed out before its first STARTs were acknowledged).
    producer = StubProducer()
    writer = make(writers, producer, flush_at=3)
    text = b"orders.dead"
    items = [(entry(S, i, text), i % 2) for i in range(10)]
    flush = writer.add_many(items, text)
    writer.flush_soon()
    assert flush.wait(WAIT_S) and not flush.errors
    got = {p: (entries, texts) for p, entries, texts in producer.records()}
    assert got == {
        p: ([e for e, q in items if q == p], [text] * sum(1 for _, q in items if q == p))
        for p in range(2)
    }


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.binary(max_size=40), min_size=1, max_size=40),
    max_record_bytes=st.integers(2 * (HEADER_BYTES + ENTRY_BYTES), 600),
)
def test_chunks_stay_under_the_budget_and_keep_order(
    texts: list[bytes], max_record_bytes: int
) -> None:
    producer = StubProducer()
    writer = MarkerWriter(producer, "markers", 1, max_record_bytes, linger_s=LONG_LINGER_S)
    try:
        entries = [entry(N, i, t) for i, t in enumerate(texts)]
        flush = Flush()
        for e, t in zip(entries, texts, strict=True):
            flush = writer.add(e, 0, t)
        writer.flush_soon()
        assert flush.wait(WAIT_S) and not flush.errors
    finally:
        assert writer.close(WAIT_S)
    budget = max_record_bytes // 2
    records = producer.records()
    got_entries = [e for _, es, _ in records for e in es]
    got_texts = [t for _, _, ts in records for t in ts]
    assert (got_entries, got_texts) == (entries, texts)
    for (_, value), (_, chunk, _) in zip(producer.sent, records, strict=True):
        assert len(value) - HEADER_BYTES <= budget or len(chunk) == 1
    total = sum(ENTRY_BYTES + len(t) for t in texts)
    if total <= budget:
        assert len(records) == 1, "no chunking while it all fits"


def test_chunking_example(writers: list[MarkerWriter]) -> None:
    producer = StubProducer()
    writer = make(writers, producer, max_record_bytes=200)  # budget: 100 bytes per record
    texts = [b"", b"x" * 20, b"", b"", b"y" * 70, b""]
    flush = Flush()
    for i, t in enumerate(texts):
        flush = writer.add(entry(N, i, t), 2, t)
    writer.flush_soon()
    assert flush.wait(WAIT_S) and not flush.errors
    # 28 + 48 fit in 100; + 28 would not. 28 + 28 fit; + 98 would not. 98; + 28 would not.
    assert [[e[3] for e in es] for _, es, _ in producer.records()] == [[0, 1], [2, 3], [4], [5]]
    assert all(p == 2 for p, _, _ in producer.records())


def test_a_refused_send_marks_its_partition_and_spares_the_others(
    writers: list[MarkerWriter],
) -> None:
    producer = StubProducer(refuse=frozenset({1}))
    writer = make(writers, producer)
    writer.add(entry(S, 1), 0)
    flush = writer.add(entry(S, 2), 1)
    writer.flush_soon()
    assert flush.wait(WAIT_S)
    assert isinstance(flush.error(1), KafkaTimeoutError)
    assert flush.error(0) is None and set(flush.errors) == {1}
    assert [p for p, _, _ in producer.records()] == [0]


def test_a_refused_send_does_not_poison_later_flushes(writers: list[MarkerWriter]) -> None:
    # A record too large for the producer is refused; the markers are not retried forever.
    producer = StubProducer(limit=HEADER_BYTES + ENTRY_BYTES + 100)
    writer = make(writers, producer)
    huge = b"h" * 500
    first = writer.add(entry(N, 1, huge), 0, huge)
    writer.flush_soon()
    assert first.wait(WAIT_S)
    assert isinstance(first.error(0), MessageSizeTooLargeError)
    assert writer.pending == 0
    second = writer.add(entry(E, 2), 0)
    assert second is not first
    writer.flush_soon()
    assert second.wait(WAIT_S) and second.errors == {}
    assert [es for _, es, _ in producer.records()] == [[entry(E, 2)]]


def test_a_flush_is_over_once_every_future_is(writers: list[MarkerWriter]) -> None:
    producer = StubProducer(hold=True)
    writer = make(writers, producer)
    writer.add(entry(S, 1), 0)
    flush = writer.add(entry(S, 2), 1)
    writer.flush_soon()
    assert producer.wait_sent(2)
    assert not flush.wait(0.05), "nothing acknowledged yet"
    producer.futures[0].success(None)
    assert not flush.done
    producer.futures[1].failure(KafkaTimeoutError("no ack"))
    assert flush.wait(WAIT_S)
    failed = [p for p, _, _ in producer.records()][1]
    assert set(flush.errors) == {failed}
    assert isinstance(flush.error(failed), KafkaTimeoutError)


def test_markers_added_while_sending_ride_in_the_next_flush(writers: list[MarkerWriter]) -> None:
    producer = StubProducer()
    producer.gate = threading.Event()
    writer = make(writers, producer)
    first = writer.add(entry(S, 1), 0)
    writer.flush_soon()
    assert producer.sending.wait(WAIT_S)  # the flusher is inside send(), blocked
    second = writer.add(entry(S, 2), 0)
    third = writer.add(entry(S, 3), 0)
    assert second is third and second is not first
    producer.gate.set()
    assert first.wait(WAIT_S)
    writer.flush_soon()
    assert second.wait(WAIT_S)
    assert [[e[3] for e in es] for _, es, _ in producer.records()] == [[1], [2, 3]]


def test_the_linger_sends_without_anyone_asking(writers: list[MarkerWriter]) -> None:
    producer = StubProducer()
    writer = make(writers, producer, linger_s=0.01)
    flush = writer.add(entry(E, 1), 3)
    assert flush.wait(WAIT_S) and not flush.errors
    assert [p for p, _, _ in producer.records()] == [3]


def test_flush_soon_bypasses_the_linger(writers: list[MarkerWriter]) -> None:
    producer = StubProducer()
    writer = make(writers, producer)
    flush = writer.add(entry(E, 1), 0)
    assert not flush.wait(0.05), "held for the (hour-long) linger"
    writer.flush_soon()
    assert flush.wait(WAIT_S)
    assert len(producer.records()) == 1


def test_flush_at_sends_a_full_flush(writers: list[MarkerWriter]) -> None:
    producer = StubProducer()
    writer = make(writers, producer, flush_at=3)
    writer.add(entry(E, 1), 0)
    flush = writer.add(entry(E, 2), 0)
    assert not flush.wait(0.05), "two of three"
    assert writer.add(entry(E, 3), 0) is flush
    assert flush.wait(WAIT_S)
    assert [len(es) for _, es, _ in producer.records()] == [3]


def test_close_flushes_everything_and_refuses_more() -> None:
    producer = StubProducer()
    writer = MarkerWriter(producer, "markers", 2, 1_000_000, linger_s=LONG_LINGER_S)
    writer.add(entry(S, 1), 0)
    flush = writer.add_many([(entry(S, 2), 1), (entry(E, 1), 0)])
    assert writer.close(WAIT_S)
    assert flush.done and not flush.errors
    assert sorted((p, [e[3] for e in es]) for p, es, _ in producer.records()) == [
        (0, [1, 1]),
        (1, [2]),
    ]
    with pytest.raises(RuntimeError, match="closed"):
        writer.add(entry(S, 3), 0)
    with pytest.raises(RuntimeError, match="closed"):
        writer.add_many([(entry(S, 3), 0)])
    assert writer.close(WAIT_S), "closing twice is harmless"


def test_close_with_nothing_pending() -> None:
    writer = MarkerWriter(StubProducer(), "markers", 2, 1_000_000)
    assert writer.close(WAIT_S)


def test_close_reports_markers_that_did_not_make_it() -> None:
    producer = StubProducer(refuse=frozenset({1}))
    writer = MarkerWriter(producer, "markers", 2, 1_000_000, linger_s=LONG_LINGER_S)
    writer.add(entry(S, 1), 0)
    writer.add(entry(S, 2), 1)
    assert not writer.close(WAIT_S)
    assert [p for p, _, _ in producer.records()] == [0]


def test_flush_ticket_bookkeeping() -> None:
    flush = Flush()
    flush._expect()
    flush._expect()
    flush._finished(0, None)
    flush._all_sent()
    assert not flush.done, "one future still out"
    flush._finished(1, ValueError("first"))
    assert flush.done and flush.wait(0)
    late = Flush()
    late._expect()
    late._expect()
    late._finished(1, ValueError("a"))
    late._finished(1, ValueError("b"))
    assert not late.done, "not over before everything was sent"
    late._all_sent()
    assert late.done
    assert str(late.error(1)) == "a", "the first error of a partition is kept"
