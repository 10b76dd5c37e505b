"""kmq.receipts: Receipt bytes, and the markers a Settler writes (over a MarkerWriter with a
stub producer); the lease check of Consumer.hand_off (kmq.consumer._lease)."""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.errors import KafkaTimeoutError
from kafka.future import Future

import kmq
from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.consumer import _lease
from kmq.marker_writer import MarkerWriter
from kmq.markers import QUEUE_LANE, RETRY_LANE, Marker, MarkerType, decode_all
from kmq.receipts import Receipt, Settler
from kmq.records import MAX_REASON_CHARS

WAIT_S = 5.0
MAX_MS = int(MAX_REDELIVERY_TIMEOUT_S * 1000)
NAN, INF = float("nan"), float("inf")

# -- Receipt bytes ----------------------------------------------------------------------------

GOOD = kmq.Receipt("q", "m", 0, 1, 2, 1, 0).encode()
HEAD = struct.Struct(">BBiqII")


def raw(
    version: int = 1,
    lane: int = 0,
    partition: int = 1,
    offset: int = 2,
    queue: bytes = b"q",
    mid: bytes = b"m",
    size: int | None = None,
) -> bytes:
    """Receipt bytes from raw fields, bypassing encode()."""
    head = HEAD.pack(version, lane, partition, offset, 1, 0)
    return head + struct.pack(">H", len(queue) if size is None else size) + queue + mid


def test_raw_matches_encode() -> None:
    assert raw() == GOOD


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01",
        b"\x09" + b"\x00" * 30,
        GOOD[:-1],
        GOOD + b"\xff",
        GOOD[: HEAD.size],
        GOOD[: HEAD.size + 1],
        raw(version=2),
        raw(version=0),
        raw(lane=2),
        raw(partition=-1),
        raw(offset=-1),
        raw(queue=b""),
        raw(mid=b""),
        raw(size=5),
        raw(queue=b"\xff"),
        raw(mid=b"\xc3"),
    ],
    ids=[
        "empty",
        "one-byte",
        "zeros",
        "message-id-cut",
        "trailing-garbage",
        "no-queue-size",
        "half-a-queue-size",
        "version-2",
        "version-0",
        "lane-2",
        "negative-partition",
        "negative-offset",
        "no-queue",
        "no-message-id",
        "queue-size-beyond-the-end",
        "queue-not-utf8",
        "message-id-not-utf8",
    ],
)
def test_a_garbled_receipt_is_refused(data: bytes) -> None:
    with pytest.raises(kmq.InvalidArgumentError):
        kmq.Receipt.decode(data)


def receipts_st(marker_partitions: int = 2**32, min_attempt: int = 0) -> st.SearchStrategy[Receipt]:
    return st.builds(
        Receipt,
        queue=st.text(min_size=1, max_size=300),
        message_id=st.text(min_size=1, max_size=100),
        lane=st.sampled_from([QUEUE_LANE, RETRY_LANE]),
        partition=st.integers(0, 2**31 - 1),
        offset=st.integers(0, 2**63 - 1),
        attempt=st.integers(min_attempt, 2**32 - 1),
        marker_partition=st.integers(0, marker_partitions - 1),
    )


receipts = receipts_st()


@settings(max_examples=300, deadline=None)
@given(receipts)
def test_receipt_round_trip(receipt: Receipt) -> None:
    data = receipt.encode()
    assert isinstance(data, bytes)
    assert Receipt.decode(data) == receipt


@pytest.mark.parametrize(
    ("queue", "message_id"),
    [("q", "m"), ("ørders", "ñ-1"), ("队列", "消息"), ("🦀" * 50, "🦀"), ("a" * 255, "x" * 1000)],
    ids=["ascii", "latin", "cjk", "emoji", "long"],
)
def test_non_ascii_round_trip(queue: str, message_id: str) -> None:
    receipt = Receipt(queue, message_id, RETRY_LANE, 7, 2**40, 3, 11)
    assert Receipt.decode(receipt.encode()) == receipt


@settings(max_examples=500, deadline=None)
@given(
    receipts,
    st.one_of(
        st.tuples(st.just("cut"), st.integers(0, 10_000)),
        st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=4)),
    ),
)
def test_a_damaged_receipt_is_refused_or_still_canonical(
    receipt: Receipt, damage: tuple[Any, ...]
) -> None:
    data = bytearray(receipt.encode())
    if damage[0] == "cut":
        del data[damage[1] % len(data) :]
    elif damage[0] == "flip":
        data[damage[1] % len(data)] ^= damage[2]
    else:
        data += damage[1]
    try:
        decoded = Receipt.decode(bytes(data))
    except kmq.InvalidArgumentError:
        return
    assert decoded.encode() == bytes(data), "only what encode() makes is accepted"
    assert decoded.queue and decoded.message_id and decoded.lane in (QUEUE_LANE, RETRY_LANE)


# -- Settler -----------------------------------------------------------------------------------


class StubProducer:
    """What a MarkerWriter needs of a producer. Futures succeed at once, or fail with
    ``error``, or (``hold``) are never answered."""

    def __init__(self, error: BaseException | None = None, hold: bool = False) -> None:
        self.error = error
        self.hold = hold
        self.sent: list[tuple[str, bytes | None, int, bytes]] = []
        self.changed = threading.Condition()

    def send(self, topic: str, *, key: bytes | None, value: bytes, partition: int) -> Future:
        future = Future()
        with self.changed:
            self.sent.append((topic, key, partition, value))
            self.changed.notify_all()
        if self.error is not None:
            future.failure(self.error)
        elif not self.hold:
            future.success(None)
        return future

    def markers(self) -> list[tuple[int, list[Marker]]]:
        with self.changed:
            return [(partition, decode_all(value)) for _, _, partition, value in self.sent]


PARTITIONS = 8


@pytest.fixture
def make_settler() -> Iterator[Callable[..., tuple[Settler, StubProducer]]]:
    """Settlers over a stub producer (Settler.__init__ needs a Service); closed after the
    test, so no flusher thread outlives it."""
    made: list[Settler] = []

    def make(
        producer: StubProducer | None = None, *, timeout_s: float = WAIT_S
    ) -> tuple[Settler, StubProducer]:
        stub = producer or StubProducer()
        settler = Settler.__new__(Settler)
        settler._timeout_s = timeout_s
        settler._writer = MarkerWriter(
            stub, "markers", PARTITIONS, 1_000_000, linger_s=3600.0, name="test-settler"
        )
        made.append(settler)
        return settler, stub

    yield make
    for settler in made:
        settler.close(WAIT_S)


R = Receipt("orders", "m-1", RETRY_LANE, 3, 77, 2, 5)

END, NACK, KEEPALIVE, RELEASE, REJECT = (
    MarkerType.END,
    MarkerType.NACK,
    MarkerType.KEEPALIVE,
    MarkerType.RELEASE,
    MarkerType.REJECT,
)

# Each row: the call, then the marker's (type, redeliver_after_ms, reason).
CALLS: dict[str, tuple[Callable[[Settler], None], tuple[MarkerType, int, str]]] = {
    "ack": (lambda s: s.ack(R), (END, 0, "")),
    "ack-list": (lambda s: s.ack([R]), (END, 0, "")),
    "nack": (lambda s: s.nack(R), (NACK, 0, "")),
    "nack-delay-reason": (lambda s: s.nack(R, 1.5, "later"), (NACK, 1500, "later")),
    "nack-delay-rounded": (lambda s: s.nack(R, delay_s=0.0004), (NACK, 0, "")),
    "nack-int-delay": (lambda s: s.nack(R, 2), (NACK, 2000, "")),
    "nack-longest-delay": (lambda s: s.nack(R, MAX_REDELIVERY_TIMEOUT_S), (NACK, MAX_MS, "")),
    "extend": (lambda s: s.extend(R, 3.0), (KEEPALIVE, 3000, "")),
    "extend-shortest": (lambda s: s.extend(R, 0.001), (KEEPALIVE, 1, "")),
    "extend-rounds-up-to-1-ms": (lambda s: s.extend(R, 0.0014), (KEEPALIVE, 1, "")),
    "extend-longest": (lambda s: s.extend(R, MAX_REDELIVERY_TIMEOUT_S), (KEEPALIVE, MAX_MS, "")),
    "release": (lambda s: s.release(R), (RELEASE, 0, "released")),
    "release-own-reason": (lambda s: s.release(R, "shutting down"), (RELEASE, 0, "shutting down")),
    "release-no-reason": (lambda s: s.release(R, ""), (RELEASE, 0, "")),
    "reject": (lambda s: s.reject(R), (REJECT, 0, "rejected")),
    "reject-own-reason": (lambda s: s.reject(R, "unparseable"), (REJECT, 0, "unparseable")),
    "reject-non-ascii": (lambda s: s.reject(R, "défaut ✗"), (REJECT, 0, "défaut ✗")),
}


@pytest.mark.parametrize(("call", "expected"), CALLS.values(), ids=CALLS.keys())
def test_settler_writes_the_marker(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
    call: Callable[[Settler], None],
    expected: tuple[MarkerType, int, str],
) -> None:
    settler, producer = make_settler()
    call(settler)  # waits for the broker's answer
    [(topic, key, partition, _)] = producer.sent
    assert (topic, key, partition) == ("markers", None, R.marker_partition)
    [(_, [m])] = producer.markers()
    assert (m.type, m.redeliver_after_ms, m.reason) == expected
    assert (m.lane, m.partition, m.offset, m.attempt) == (R.lane, R.partition, R.offset, R.attempt)
    assert m.max_attempts == 0


def test_ack_many_writes_one_record_per_marker_partition(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
) -> None:
    settler, producer = make_settler()
    batch = [
        Receipt("q", f"m-{i}", QUEUE_LANE, 0, 100 + i, 1, marker_partition)
        for i, marker_partition in enumerate([1, 4, 1, 1, 4])
    ]
    settler.ack(batch)
    written = dict(producer.markers())
    assert sorted(written) == [1, 4] and len(producer.sent) == 2
    assert [m.offset for m in written[1]] == [100, 102, 103], "in the order given"
    assert [m.offset for m in written[4]] == [101, 104]
    assert {m.type for ms in written.values() for m in ms} == {END}


def test_ack_of_nothing_writes_nothing(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
) -> None:
    settler, producer = make_settler()
    settler.ack([])
    assert settler._writer.pending == 0
    settler.close()
    assert producer.sent == []


def test_without_wait_the_marker_goes_out_later(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
) -> None:
    settler, producer = make_settler()
    settler.ack(R, wait=False)
    settler.reject(R, wait=False)
    assert settler._writer.pending == 2, "queued, not flushed (the linger is an hour)"
    settler.close(WAIT_S)
    [(partition, markers)] = producer.markers()
    assert partition == R.marker_partition and [m.type for m in markers] == [END, REJECT]


@pytest.mark.parametrize(
    ("reason", "written"),
    [
        ("x" * MAX_REASON_CHARS, "x" * MAX_REASON_CHARS),
        ("x" * (MAX_REASON_CHARS + 1), "x" * (MAX_REASON_CHARS - 1) + "…"),
        ("é" * 5000, "é" * (MAX_REASON_CHARS - 1) + "…"),
    ],
    ids=["at-the-limit", "one-over", "non-ascii"],
)
@pytest.mark.parametrize("method", ["nack", "release", "reject"])
def test_long_reasons_are_cut(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
    method: str,
    reason: str,
    written: str,
) -> None:
    settler, producer = make_settler()
    getattr(settler, method)(R, reason=reason)
    [(_, [m])] = producer.markers()
    assert m.reason == written and len(m.reason) <= MAX_REASON_CHARS


BAD_DELAYS = [-0.001, -1, NAN, INF, -INF, MAX_REDELIVERY_TIMEOUT_S + 0.001, True, "1", None]
BAD_LEASES = [0, 0.0009, -1, NAN, INF, MAX_REDELIVERY_TIMEOUT_S + 0.001, False, "5", None]
BAD_REASONS = [None, b"bytes", 5]

# Each: the Settler method and its arguments after the receipt.
BAD_CALLS: list[tuple[str, tuple[object, ...]]] = [
    *[("nack", (v,)) for v in BAD_DELAYS],
    *[("extend", (v,)) for v in BAD_LEASES],
    *[("nack", (0, v)) for v in BAD_REASONS],
    *[("nack", (1.0, v)) for v in BAD_REASONS],
    *[("nack", (-1, "ok")), ("nack", (NAN, None))],
    *[("release", (v,)) for v in BAD_REASONS],
    *[("reject", (v,)) for v in BAD_REASONS],
]


@pytest.mark.parametrize(("method", "args"), BAD_CALLS, ids=[f"{m}{a!r}" for m, a in BAD_CALLS])
def test_bad_arguments_are_refused_before_anything_is_written(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
    method: str,
    args: tuple[object, ...],
) -> None:
    settler, producer = make_settler()
    with pytest.raises(kmq.InvalidArgumentError):
        getattr(settler, method)(R, *args)
    assert settler._writer.pending == 0
    settler.close(WAIT_S)
    assert producer.sent == []


def test_a_marker_the_broker_refuses_raises(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
) -> None:
    settler, producer = make_settler(StubProducer(error=KafkaTimeoutError("down")))
    with pytest.raises(kmq.BrokerError, match="REJECT of m-1 not written"):
        settler.reject(R)
    assert len(producer.sent) == 1
    settler.ack(R, wait=False)  # not waited for: nothing to raise


def test_a_marker_never_answered_times_out(
    make_settler: Callable[..., tuple[Settler, StubProducer]],
) -> None:
    settler, producer = make_settler(StubProducer(hold=True), timeout_s=0.05)
    with pytest.raises(kmq.BrokerError, match=r"END not acknowledged in 0\.05 s"):
        settler.ack(R)
    assert len(producer.sent) == 1


@settings(max_examples=50, deadline=None)
@given(receipts_st(marker_partitions=PARTITIONS, min_attempt=1))
def test_any_receipt_is_settled_where_its_markers_live(receipt: Receipt) -> None:
    producer = StubProducer()
    settler = Settler.__new__(Settler)
    settler._timeout_s = WAIT_S
    settler._writer = MarkerWriter(producer, "markers", PARTITIONS, 1_000_000, linger_s=3600.0)
    try:
        settler.extend(receipt, 1.0)
        settler.ack(receipt)
    finally:
        settler.close(WAIT_S)
    written = producer.markers()
    assert [p for p, _ in written] == [receipt.marker_partition] * 2
    for (_, [m]), kind in zip(written, [KEEPALIVE, END], strict=True):
        assert m.type is kind
        assert (m.lane, m.partition, m.offset, m.attempt) == (
            receipt.lane,
            receipt.partition,
            receipt.offset,
            receipt.attempt,
        )


# -- Consumer.hand_off's lease ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lease_s", "ms"),
    [
        (1, 1000),
        (0.5, 500),
        (0.0001, 1),
        (0.0015, 2),
        (MAX_REDELIVERY_TIMEOUT_S, MAX_MS),
    ],
    ids=["int", "half", "rounded-up-to-1-ms", "rounded", "longest"],
)
def test_hand_off_lease(lease_s: float, ms: int) -> None:
    assert _lease(lease_s) == ms


@pytest.mark.parametrize(
    "lease_s",
    [0, 0.0, -1, NAN, INF, -INF, MAX_REDELIVERY_TIMEOUT_S + 0.001, True, "5", None, b"1"],
    ids=repr,
)
def test_hand_off_lease_refused(lease_s: object) -> None:
    with pytest.raises(kmq.InvalidArgumentError, match="lease_s"):
        _lease(lease_s)
