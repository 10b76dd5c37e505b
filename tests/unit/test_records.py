"""Queue-record layout: kmq headers, delivery keys and the record size bound."""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from kmq.markers import LANES, MAX_ATTEMPT
from kmq.records import (
    ATTEMPT_HEADER,
    DLQ_ATTEMPTS_HEADER,
    DLQ_HEADERS,
    DLQ_ORIGIN_HEADER,
    DLQ_REASON_HEADER,
    ID_HEADER,
    MAX_OFFSET,
    MAX_PARTITION,
    MAX_REASON_CHARS,
    dead_letter_headers,
    delivery_key,
    fits_key,
    new_message_id,
    parse_queue_headers,
    queue_headers,
    record_size,
    split_key,
)
from kmq.validation import RESERVED_HEADER_PREFIX

SETTINGS = settings(max_examples=200, deadline=None)

user_headers = st.lists(
    st.tuples(
        st.text(min_size=1).filter(lambda n: not n.startswith(RESERVED_HEADER_PREFIX)),
        st.binary(),
    ),
    max_size=5,
).map(tuple)


def test_kmq_headers_are_reserved_names() -> None:
    for name in (ID_HEADER, ATTEMPT_HEADER, *DLQ_HEADERS):
        assert name.startswith(RESERVED_HEADER_PREFIX)


def test_new_message_ids_are_distinct_hex() -> None:
    ids = {new_message_id() for _ in range(1000)}  # several draws of ids ahead
    assert len(ids) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_forked_child_never_hands_out_its_parents_ids() -> None:
    new_message_id()  # the parent now holds ids drawn ahead
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        os.write(write_end, "".join(new_message_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    child = {text[i : i + 32] for i in range(0, len(text), 32)}
    parent = {new_message_id() for _ in range(300)}
    assert len(child) == 300
    assert not child & parent


# -- headers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        (1, [(ID_HEADER, b"m"), ("u", b"v")]),  # attempt 1 is the default: no header
        (2, [(ID_HEADER, b"m"), (ATTEMPT_HEADER, b"2"), ("u", b"v")]),
        (MAX_ATTEMPT, [(ID_HEADER, b"m"), (ATTEMPT_HEADER, b"4294967295"), ("u", b"v")]),
    ],
)
def test_queue_headers_layout(attempt: int, expected: list[tuple[str, bytes]]) -> None:
    assert queue_headers("m", attempt, [("u", b"v")]) == expected


@SETTINGS
@given(st.text(min_size=1), st.integers(1, MAX_ATTEMPT), user_headers)
def test_queue_headers_round_trip(
    message_id: str, attempt: int, headers: tuple[tuple[str, bytes], ...]
) -> None:
    assert parse_queue_headers(queue_headers(message_id, attempt, headers)) == (
        message_id,
        attempt,
        headers,
    )


def test_dead_letter_headers() -> None:
    user = [("u", b"v"), (DLQ_REASON_HEADER, b"older"), ("w", b"")]
    headers = dead_letter_headers("m", "orders", 5, "boom", user)
    assert headers == [
        (ID_HEADER, b"m"),
        ("u", b"v"),
        ("w", b""),
        (DLQ_ORIGIN_HEADER, b"orders"),
        (DLQ_ATTEMPTS_HEADER, b"5"),
        (DLQ_REASON_HEADER, b"boom"),
    ]
    message_id, attempt, kept = parse_queue_headers(headers)
    assert (message_id, attempt) == ("m", 1), "a dead letter starts again at attempt 1"
    assert [name for name, _ in kept].count(DLQ_REASON_HEADER) == 1


def test_a_dead_letter_keeps_the_start_of_a_long_reason() -> None:
    # kmq 0.1 markers carried reasons of any length; the dead letter keeps a bounded one.
    reason = "é" * 70_000
    headers = dict(dead_letter_headers("m", "orders", 5, reason, []))
    assert headers[DLQ_REASON_HEADER] == ("é" * MAX_REASON_CHARS).encode()


@pytest.mark.parametrize("headers", [None, []])
def test_foreign_record_without_headers(headers: list[tuple[str, bytes]] | None) -> None:
    assert parse_queue_headers(headers) == (None, 1, ())


def test_foreign_record_keeps_its_headers() -> None:
    headers = [("traceparent", b"00-ab"), ("nullable", None)]
    assert parse_queue_headers(headers) == (None, 1, (("traceparent", b"00-ab"), ("nullable", b"")))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"abc", 1),
        (b"", 1),
        (None, 1),
        (b"0", 1),
        (b"-4", 1),
        (b"\xff", 1),
        (b"9" * 5000, 1),  # beyond int()'s digit limit
        (b"7", 7),
        (str(MAX_ATTEMPT).encode(), MAX_ATTEMPT),
        (str(MAX_ATTEMPT + 1).encode(), MAX_ATTEMPT),  # must still fit a marker's uint32
        (b"99999999999999", MAX_ATTEMPT),
    ],
)
def test_attempt_header_is_sanitised(raw: bytes | None, expected: int) -> None:
    _, attempt, _ = parse_queue_headers([(ATTEMPT_HEADER, raw)])
    assert attempt == expected


def test_invalid_utf8_message_id_is_replaced_not_raised() -> None:
    message_id, _, _ = parse_queue_headers([(ID_HEADER, b"ab\xffcd")])
    assert message_id == b"ab\xffcd".decode("utf-8", "replace")


@pytest.mark.parametrize("value", [b"", None])
def test_empty_id_header_means_foreign(value: bytes | None) -> None:
    assert parse_queue_headers([(ID_HEADER, value)])[0] is None


# -- delivery keys ------------------------------------------------------------------------------

deliveries = st.tuples(
    st.sampled_from(LANES), st.integers(0, MAX_PARTITION), st.integers(0, MAX_OFFSET)
)


@SETTINGS
@given(deliveries)
@example((1, MAX_PARTITION, MAX_OFFSET))
@example((0, 0, 0))
def test_delivery_key_round_trip(delivery: tuple[int, int, int]) -> None:
    assert fits_key(delivery[1], delivery[2])
    assert split_key(delivery_key(*delivery)) == delivery


@SETTINGS
@given(deliveries, deliveries)
def test_delivery_keys_are_distinct(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    assert (delivery_key(*a) == delivery_key(*b)) == (a == b)


def test_lanes_do_not_collide() -> None:
    assert delivery_key(0, 3, 40) != delivery_key(1, 3, 40)
    assert split_key(delivery_key(1, 3, 40)) == (1, 3, 40)


@pytest.mark.parametrize(
    ("partition", "offset", "fits"),
    [
        (0, 0, True),
        (MAX_PARTITION, MAX_OFFSET, True),
        (MAX_PARTITION + 1, 0, False),
        (0, MAX_OFFSET + 1, False),
        (-1, 0, False),
        (0, -1, False),
        (2**31 - 1, 2**63 - 1, False),
    ],
)
def test_fits_key(partition: int, offset: int, fits: bool) -> None:
    assert (MAX_PARTITION, MAX_OFFSET) == (2**15 - 1, 2**44 - 1)
    assert fits_key(partition, offset) is fits


# -- record size --------------------------------------------------------------------------------


def real_batch_size(key: bytes, payload: bytes, headers: list[tuple[str, bytes]]) -> int:
    """The bytes of a one-record batch as the producer builds it (no compression)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=2**62,
        producer_epoch=2**14,
        base_sequence=2**30,
        batch_size=2**30,
    )
    builder.append(0, timestamp=2**62, key=key, value=payload, headers=headers)
    return len(builder.build())


@SETTINGS
@given(
    queue=st.text(min_size=1, max_size=249),
    payload=st.binary(max_size=2000),
    headers=user_headers,
    attempt=st.integers(1, MAX_ATTEMPT),
)
@example(queue="q" * 249, payload=b"p", headers=(("h", b"v"),), attempt=MAX_ATTEMPT)
def test_record_size_is_an_upper_bound(
    queue: str, payload: bytes, headers: tuple[tuple[str, bytes], ...], attempt: int
) -> None:
    """Whatever attempt a copy carries, its record is no larger than ``record_size``, in
    kafka-python's own estimate (what ``max_request_size`` is checked against) and built."""
    key = queue.encode()
    bound = record_size(key, payload, headers)
    for message_id in (new_message_id(), f"ext-{2**31 - 1}-{2**63 - 1}"):
        full = queue_headers(message_id, attempt, headers)
        assert bound >= DefaultRecordBatchBuilder.estimate_size_in_bytes(key, payload, full)
        assert bound >= real_batch_size(key, payload, full)


def test_record_size_counts_every_byte_of_input() -> None:
    base = record_size(b"q", b"", ())
    assert record_size(b"q", b"x" * 1000, ()) - base == 1000
    assert record_size(b"q" * 11, b"", ()) - base == 10
    assert record_size(b"q", b"", (("é" * 10, b"v" * 5),)) - base >= 25
