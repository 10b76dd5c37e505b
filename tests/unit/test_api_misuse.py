"""Misuse of the public API fails fast, with kmq errors, and without touching the network."""

from __future__ import annotations

import inspect
import math
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kmq
import kmq.errors
from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.continuity import Continuity
from kmq.message import State
from kmq.records import record_size
from kmq.validation import MAX_QUEUE_ID_BYTES

UNREACHABLE = "127.0.0.1:1"
REPO = Path(__file__).resolve().parents[2]


class NetworkTouched(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything that would reach a broker raises NetworkTouched instead."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise NetworkTouched("network I/O attempted")

    monkeypatch.setattr(kmq.Service, "kafka_producer", refuse)
    monkeypatch.setattr(kmq.Service, "ensure_topics", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def service(**settings: Any) -> kmq.Service:
    return kmq.Service(bootstrap_servers=UNREACHABLE, **settings)


def producer(**settings: Any) -> kmq.Producer:
    return service(**settings).queue("q").producer()


# -- Service and queues -----------------------------------------------------------------------


def test_service_constructs_without_connecting() -> None:
    svc = service()
    assert svc.config.bootstrap_servers == UNREACHABLE
    assert isinstance(svc.queue("x").producer(), kmq.Producer)


def test_service_accepts_a_config_object() -> None:
    cfg = kmq.ServiceConfig(bootstrap_servers=UNREACHABLE)
    assert kmq.Service(cfg).config is cfg


def test_service_rejects_config_plus_settings() -> None:
    cfg = kmq.ServiceConfig(bootstrap_servers=UNREACHABLE)
    with pytest.raises(kmq.KmqError):
        kmq.Service(cfg, queue_partitions=2)


def test_service_rejects_bad_settings() -> None:
    with pytest.raises(kmq.ConfigError, match="queue_partitions"):
        service(queue_partitions=0)


def test_send_really_is_guarded() -> None:
    """The guard works: a valid send gets as far as the network and stops there."""
    with pytest.raises(NetworkTouched):
        producer().send(b"ok", {"h": b"v"})


def test_queue_is_cached_per_id() -> None:
    svc = service()
    q = svc.queue("x")
    assert svc.queue("x") is q
    assert svc.queue("y") is not q
    assert q.id == "x" and q.service is svc


@pytest.mark.parametrize(
    "queue_id",
    ["x", "a" * MAX_QUEUE_ID_BYTES, "€" * (MAX_QUEUE_ID_BYTES // 3), "orders.v1/π", "ü-_:#"],
)
def test_valid_queue_ids(queue_id: str) -> None:
    assert service().queue(queue_id).id == queue_id


@pytest.mark.parametrize(
    "queue_id",
    [
        "",
        "a" * (MAX_QUEUE_ID_BYTES + 1),
        "€" * (MAX_QUEUE_ID_BYTES // 3 + 1),  # few characters, too many UTF-8 bytes
        " ",
        "a b",
        "a\tb",
        "trailing\n",
        "\u00a0nbsp",
        "nul\x00",
        "bell\x07",
        "\ud800",  # lone surrogate: not encodable
        None,
        5,
        b"bytes",
        ["list"],
    ],
)
def test_invalid_queue_ids(queue_id: Any) -> None:
    with pytest.raises(kmq.InvalidQueueError):
        service().queue(queue_id)


# -- producer.send input checks ----------------------------------------------------------------


@pytest.mark.parametrize("payload", ["text", 5, None, 1.5, ["b"], {"a": b"b"}])
def test_send_rejects_non_bytes_payload(payload: Any) -> None:
    with pytest.raises(kmq.InvalidMessageError, match="payload"):
        producer().send(payload)


@pytest.mark.parametrize("payload", [b"", bytearray(b"ba"), memoryview(b"mv")])
def test_send_accepts_bytes_like_payload(payload: Any) -> None:
    with pytest.raises(NetworkTouched):
        producer().send(payload)


@pytest.mark.parametrize(
    "headers",
    [
        {"kmq.id": b"forged"},
        {"kmq.attempt": b"1"},
        {"kmq.anything": b""},
        {"h": "str"},
        {"h": None},
        {"h": 5},
        {"h": memoryview(b"x")},
        {5: b"x"},
        {b"h": b"x"},
        {"": b"x"},
        {"\udcff": b"x"},  # not encodable as UTF-8
        [("h", b"x")],
        "h=x",
    ],
)
def test_send_rejects_bad_headers(headers: Any) -> None:
    with pytest.raises(kmq.InvalidMessageError):
        producer().send(b"payload", headers)


@pytest.mark.parametrize("headers", [None, {}, {"h": b""}, {"Kmq.x": b"1", "h2": bytearray(b"2")}])
def test_send_accepts_good_headers(headers: Any) -> None:
    with pytest.raises(NetworkTouched):
        producer().send(b"payload", headers)


def test_payload_as_large_as_the_limit_is_too_large() -> None:
    with pytest.raises(kmq.MessageTooLargeError, match="max_message_bytes"):
        producer(max_message_bytes=1_000_000).send(b"x" * 1_000_000)


@pytest.mark.parametrize("headers", [{}, {"h": b"v"}, {"€" * 100: b"x" * 50}])
@pytest.mark.parametrize(("extra", "fits"), [(0, True), (1, False)])
def test_the_size_limit_is_exact(headers: dict[str, bytes], extra: int, fits: bool) -> None:
    """A record of exactly max_message_bytes (by record_size) goes out; one byte more not."""
    limit = 20_000
    pairs = tuple(headers.items())
    payload = b"x" * (limit - record_size(b"q", b"", pairs) + extra)
    assert (record_size(b"q", payload, pairs) <= limit) is fits
    with pytest.raises(NetworkTouched if fits else kmq.MessageTooLargeError):
        producer(max_message_bytes=limit).send(payload, headers)


@pytest.mark.parametrize(
    "headers",
    [
        {"é" * 50_000: b""},  # 100,000 UTF-8 bytes in 50,000 characters
        {f"h{i}": b"" for i in range(1000)},  # record overhead of many small headers
    ],
    ids=["non-ascii-header-name", "many-headers"],
)
def test_size_check_cannot_be_fooled_by_headers(headers: dict[str, bytes]) -> None:
    limit = 1_000_000
    # The largest payload a size estimate counting header characters, not bytes, and no
    # per-header overhead lets through (4096 bytes of slack, the 1-byte queue key).
    headers_len = sum(len(k) + len(v) for k, v in headers.items())
    payload = b"x" * (limit - 4096 - headers_len - 1)
    size = record_size(b"q", payload, tuple(headers.items()))
    assert size > limit, "the example must really be too large"
    with pytest.raises(kmq.MessageTooLargeError):
        producer(max_message_bytes=limit).send(payload, headers)


header_sets = st.one_of(
    st.lists(
        st.tuples(st.sampled_from("aé€𝄞"), st.integers(1, 3000), st.integers(0, 200)),
        max_size=4,
    ).map(lambda hs: {f"{i}{c * n}": b"v" * m for i, (c, n, m) in enumerate(hs)}),
    st.integers(0, 1500).map(lambda n: {f"h{i}": b"" for i in range(n)}),
)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1024, 60_000),
    fill=st.floats(0, 1.2),
    headers=header_sets,
)
def test_send_reaches_network_iff_the_record_fits(
    limit: int, fill: float, headers: dict[str, bytes]
) -> None:
    payload = b"x" * int(limit * fill)
    size = record_size(b"q", payload, tuple(headers.items()))
    svc = kmq.Service(bootstrap_servers=UNREACHABLE, max_message_bytes=limit)

    def reached(*args: object, **kwargs: object) -> None:
        raise NetworkTouched

    svc.kafka_producer = reached  # type: ignore[method-assign]
    expected = kmq.MessageTooLargeError if size > limit else NetworkTouched
    with pytest.raises(expected):
        svc.queue("q").producer().send(payload, headers)


# -- Message.nack ------------------------------------------------------------------------------


class StubSettler:
    def __init__(self) -> None:
        self.calls: list[tuple[State, int | None, str]] = []

    def _settle(
        self, message: kmq.Message, state: State, delay_ms: int | None, reason: str, *rest: object
    ) -> None:
        self.calls.append((state, delay_ms, reason))


def message(settler: StubSettler) -> kmq.Message:
    return kmq.Message(
        settler,
        payload=b"p",
        message_id="m",
        queue="q",
        attempt=1,
        headers={},
        partition=0,
        offset=0,
        timestamp_ms=0,
    )


@pytest.mark.parametrize(
    "delay",
    [
        -1,
        -0.001,
        math.nan,
        math.inf,
        -math.inf,
        MAX_REDELIVERY_TIMEOUT_S + 0.001,
        10**400,
        True,
        "1",
        [1],
    ],
)
def test_nack_rejects_bad_delay(delay: Any) -> None:
    settler = StubSettler()
    with pytest.raises(kmq.InvalidArgumentError, match="delay_s"):
        message(settler).nack(delay)
    assert settler.calls == []


@pytest.mark.parametrize("verb", ["nack", "reject"])
@pytest.mark.parametrize(
    ("length", "kept"), [(0, 0), (1000, 1000), (1001, 1000), (2_000_000, 1000)]
)
def test_long_reasons_are_cut_to_1000_characters(verb: str, length: int, kept: int) -> None:
    settler = StubSettler()
    reason = "é" * length
    getattr(message(settler), verb)(reason=reason)
    ((_, _, settled_reason),) = settler.calls
    assert len(settled_reason) == kept
    if length > kept:
        assert settled_reason == "é" * 999 + "\u2026"


def test_nack_without_delay_leaves_it_to_the_retry_policy() -> None:
    settler = StubSettler()
    message(settler).nack()
    assert settler.calls == [(State.NACKED, None, "")]


@pytest.mark.parametrize("settle", ["nack", "reject"])
def test_settling_rejects_non_str_reason(settle: str) -> None:
    settler = StubSettler()
    with pytest.raises(kmq.InvalidArgumentError, match="reason must be a str"):
        getattr(message(settler), settle)(reason=b"bytes")
    assert settler.calls == []


@pytest.mark.parametrize("delay", [0, 0.0015, 2, MAX_REDELIVERY_TIMEOUT_S])
def test_nack_accepts_valid_delay(delay: float) -> None:
    settler = StubSettler()
    message(settler).nack(delay, reason="why")
    assert settler.calls == [(State.NACKED, round(delay * 1000), "why")]


def test_message_headers_are_read_only() -> None:
    msg = message(StubSettler())
    with pytest.raises(TypeError):
        msg.headers["x"] = b"y"  # type: ignore[index]


@pytest.mark.parametrize(
    "headers",
    [
        {"a": b"1", "b": b""},
        [("a", b"1"), ("b", b"")],
        (("a", b"0"), ("b", b""), ("a", b"1")),  # a repeated name: the last one wins
    ],
    ids=["mapping", "pairs", "repeated"],
)
def test_message_headers_from_a_mapping_or_pairs(headers: Any) -> None:
    msg = kmq.Message(
        StubSettler(),
        payload=b"p",
        message_id="m",
        queue="q",
        attempt=2,
        headers=headers,
        partition=3,
        offset=4,
        timestamp_ms=5,
        lane=1,
    )
    assert dict(msg.headers) == {"a": b"1", "b": b""}
    assert msg.headers is msg.headers, "built once"
    with pytest.raises(TypeError):
        msg.headers["a"] = b"2"  # type: ignore[index]
    assert (msg.lane, msg.partition, msg.offset, msg.attempt) == (1, 3, 4, 2)
    assert msg.state is State.BUFFERED


def test_message_defaults_to_the_queue_lane() -> None:
    msg = message(StubSettler())
    assert (msg.lane, msg.key, dict(msg.headers)) == (0, 0, {})


# -- the package -------------------------------------------------------------------------------


def _exception_classes() -> list[type[BaseException]]:
    return [
        cls
        for _, cls in inspect.getmembers(kmq.errors, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == kmq.errors.__name__
    ]


def test_error_classes_found() -> None:
    assert {c.__name__ for c in _exception_classes()} >= {
        n for n in kmq.__all__ if n.endswith("Error")
    }


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: c.__name__)
def test_every_error_derives_from_kmq_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, kmq.KmqError)
    assert getattr(kmq, cls.__name__) is cls, "every error is exported"


def test_message_too_large_is_an_invalid_message() -> None:
    assert issubclass(kmq.MessageTooLargeError, kmq.InvalidMessageError)


def test_all_lists_only_existing_names() -> None:
    assert len(set(kmq.__all__)) == len(kmq.__all__)
    missing = [name for name in kmq.__all__ if not hasattr(kmq, name)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from kmq import *", namespace)
    assert set(kmq.__all__) <= set(namespace)


def test_import_does_no_io() -> None:
    code = textwrap.dedent(
        """
        import sys, threading
        events = []
        IO = ("socket.", "subprocess.", "os.system", "os.fork", "os.exec", "os.posix_spawn")
        sys.addaudithook(lambda event, args: event.startswith(IO) and events.append(event))
        import kmq, tracker.state
        assert events == [], events
        assert threading.active_count() == 1, threading.enumerate()
        print("clean")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "clean"


class _Seeks:
    """The consumer's Kafka client, as far as seeking goes; partition 9 was revoked.
    ``committed`` is the group's committed offset per partition (none: the log starts at
    ``log_start``); ``None`` makes those lookups fail."""

    def __init__(self, committed: dict[int, int] | None = None, log_start: int = 0) -> None:
        self.seeks: list[tuple[Any, int]] = []
        self._committed = committed
        self._log_start = log_start
        self.lookups = 0

    def committed(self, tp: Any, timeout_ms: int | None = None) -> int | None:
        from kafka.errors import KafkaTimeoutError

        self.lookups += 1
        if self._committed is None:
            raise KafkaTimeoutError("no coordinator")
        return self._committed.get(tp.partition)

    def beginning_offsets(self, tps: list[Any], timeout_ms: int | None = None) -> dict[Any, int]:
        return dict.fromkeys(tps, self._log_start)

    def seek(self, tp: Any, offset: int) -> None:
        if tp.partition == 9:
            raise AssertionError("revoked meanwhile")  # swallowed: its new owner reads it
        self.seeks.append((tp, offset))


class Rec:
    def __init__(self, offset: int) -> None:
        self.offset = offset


def _seeking_consumer(
    committed: dict[int, int] | None = None, log_start: int = 0
) -> tuple[Any, _Seeks]:
    """A Consumer with only what its seeking and gap checks use, on a stub client."""
    from kmq.consumer import Consumer

    consumer = Consumer.__new__(Consumer)
    stub = _Seeks(committed, log_start)
    consumer._kc = stub
    consumer._retry_topic = "q.retry"
    consumer.queue = "q"
    consumer._request_timeout_s = 5.0
    consumer._keepalive_s = 10.0
    consumer._continuity = Continuity()
    return consumer, stub


def test_records_a_paused_poll_returns_are_read_again_not_dropped() -> None:
    """The consumer loop's paused branch polls only to keep its memberships alive; a
    partition assigned during that poll is not paused yet and can return a record. The
    consumer seeks back to it, so the position never passes a record no one started."""
    from kafka import TopicPartition

    consumer, stub = _seeking_consumer({0: 41, 9: 7})
    a, b, gone = TopicPartition("q", 0), TopicPartition("q", 1), TopicPartition("q", 9)
    consumer._unread({a: [Rec(41), Rec(42)], b: [], gone: [Rec(7)]})
    assert stub.seeks == [(a, 41)]
    # A paused poll that jumped over records is sought back to before the jump.
    consumer._unread({a: [Rec(45)]})
    assert stub.seeks[-1] == (a, 41)


def test_a_poll_that_jumps_over_records_is_read_again() -> None:
    """Records after a gap are dropped and their partition sought back to where the last
    poll ended; the same gap found again is a hole in the log and is read on."""
    from kafka import TopicPartition

    consumer, stub = _seeking_consumer({0: 10, 1: 3})
    a, b = TopicPartition("q", 0), TopicPartition("q", 1)
    first = consumer._whole({a: [Rec(10), Rec(11)], b: [Rec(3)]})
    assert sorted(first) == [a, b] and stub.seeks == []
    skipped = consumer._whole({a: [Rec(14)], b: [Rec(4)]})
    assert list(skipped) == [b]  # a's 12 and 13 were skipped: read again
    assert stub.seeks == [(a, 12)]
    again = consumer._whole({a: [Rec(12), Rec(13), Rec(14)]})
    assert [r.offset for r in again[a]] == [12, 13, 14]
    assert consumer._continuity.recovered == 1
    hole = consumer._whole({a: [Rec(17)]})  # 15 and 16 are transaction markers, say
    assert hole == {} and stub.seeks[-1] == (a, 15)
    assert [r.offset for r in consumer._whole({a: [Rec(17)]})[a]] == [17]


@pytest.mark.parametrize(
    ("committed", "log_start", "polled", "kept", "sought"),
    [
        ({0: 5}, 0, [5, 6], [5, 6], None),  # starts where the group left off
        ({0: 5}, 0, [8, 9], [], 5),  # skipped 5 to 7 at its start: read again from 5
        ({}, 0, [0, 1], [0, 1], None),  # nothing committed: from the log's start
        ({}, 0, [3, 4], [], 0),  # skipped the log's first three records
        ({}, 40, [40], [40], None),  # the log starts later (retention)
        ({0: 9}, 0, [7, 8, 9], [7, 8, 9], None),  # behind the commit: nothing skipped
        (None, 0, [8, 9], [8, 9], None),  # the start cannot be told: trusted, as before
    ],
)
def test_the_first_poll_of_a_partition_is_checked_against_where_it_starts(
    committed: dict[int, int] | None,
    log_start: int,
    polled: list[int],
    kept: list[int],
    sought: int | None,
) -> None:
    """A partition's first poll after its assignment has no earlier poll to compare with;
    it is checked against the group's committed offset, or the log's start."""
    from kafka import TopicPartition

    consumer, stub = _seeking_consumer(committed, log_start)
    a = TopicPartition("q", 0)
    got = consumer._whole({a: [Rec(o) for o in polled]})
    assert [r.offset for r in got.get(a, [])] == kept
    assert stub.seeks == ([] if sought is None else [(a, sought)])
    consumer._whole({a: [Rec(polled[-1] + 1)]})
    assert stub.lookups == 1, "looked up once per assignment, not per poll"


class _Positions:
    """The consumer's Kafka client, as far as the old-layout check goes."""

    def __init__(self, positions: dict[int, int | None]) -> None:
        self.positions = positions

    def assignment(self) -> set[Any]:
        from kafka import TopicPartition

        return {TopicPartition("q.queue", p) for p in self.positions}

    def position(self, tp: Any, timeout_ms: int | None = None) -> int | None:
        return self.positions[tp.partition]


def test_the_old_layout_check_waits_for_a_position_it_does_not_know_yet() -> None:
    """A partition just assigned has no position until its committed offset is read
    (kafka-python answers None with timeout_ms=0): not done yet, and no crash."""
    from kmq.consumer import Consumer

    consumer: Any = Consumer.__new__(Consumer)
    consumer.queue = "q"
    consumer._kc = _Positions({0: None, 1: 50, 2: 49})
    consumer._legacy_done = set()
    consumer._read = {0: 50, 1: 50, 2: 50}  # each read up to its old-layout end, offset 50
    consumer._check_legacy()
    assert consumer._legacy_done == {1}
    consumer._kc.positions.update({0: 50, 2: 50})
    consumer._check_legacy()
    assert consumer._legacy_done == {0, 1, 2}


class _Layout:
    """The service as far as a consumer's layout goes: partition 0 is the queue's own,
    1 and 2 hold records of the old layout up to offset 50."""

    def read_partitions(self, queue: str, topic: str | None = None) -> dict[int, int | None]:
        return {0: None, 1: 50, 2: 50}

    def write_partitions(self, queue: str, topic: str | None = None) -> tuple[int, ...]:
        return (0,)

    def partition_count(self, topic: str) -> int:
        return 3


class _Committed:
    """A Kafka client that knows partition 1's committed offset and cannot tell 2's."""

    def __init__(self) -> None:
        self.timeouts: list[int | None] = []

    def committed(self, tp: Any, timeout_ms: int | None = None) -> int | None:
        from kafka.errors import KafkaTimeoutError

        self.timeouts.append(timeout_ms)
        if tp.partition == 2:
            raise KafkaTimeoutError("no coordinator")
        return 50


def test_the_old_layout_lookup_is_bounded_and_a_failed_one_keeps_reading() -> None:
    """The consumer loop, which writes the keep-alives, asks for old-layout partitions'
    committed offsets when the layout changes: it waits half a keep-alive interval at most
    (unbounded, an unreachable coordinator would stall the keep-alives for the request
    timeout), and a partition it cannot tell about is still read, never dropped."""
    from types import SimpleNamespace

    from kmq.consumer import Consumer

    consumer: Any = Consumer.__new__(Consumer)
    consumer.queue = "q"
    consumer._topic, consumer._retry_topic = "q.queue", "q.retry"
    consumer._pauses = SimpleNamespace(version=1)
    consumer._layout_version = 0
    consumer._svc = _Layout()
    consumer._kc = client = _Committed()
    consumer._legacy_done = set()
    consumer._declared = frozenset()
    consumer._keepalive_s, consumer._request_timeout_s = 1.0, 30.0
    consumer._refresh_layout(initial=True)
    assert client.timeouts == [500, 500]
    assert consumer._legacy_done == {1}  # read up to its old-layout end already
    assert consumer._declared == {0, 2}  # 2 unknown: still read
