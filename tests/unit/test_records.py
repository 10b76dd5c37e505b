"""Queue-record layout (kmq headers) and the START marker size bound."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kmq.markers import MAX_ATTEMPT, Marker, MarkerType, encode
from kmq.records import (
    ATTEMPT_HEADER,
    ID_HEADER,
    RECORD_OVERHEAD_BYTES,
    new_message_id,
    parse_queue_headers,
    queue_headers,
    start_marker_record_size,
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
    assert ID_HEADER.startswith(RESERVED_HEADER_PREFIX)
    assert ATTEMPT_HEADER.startswith(RESERVED_HEADER_PREFIX)


def test_new_message_ids_are_distinct_hex() -> None:
    ids = {new_message_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


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
def test_attempt_header_is_sanitised(raw: bytes, expected: int) -> None:
    _, attempt, _ = parse_queue_headers([(ATTEMPT_HEADER, raw)])
    assert attempt == expected


def test_invalid_utf8_message_id_is_replaced_not_raised() -> None:
    message_id, _, _ = parse_queue_headers([(ID_HEADER, b"ab\xffcd")])
    assert message_id == b"ab\xffcd".decode("utf-8", "replace")


def test_empty_id_header_means_foreign() -> None:
    assert parse_queue_headers([(ID_HEADER, b"")])[0] is None


@SETTINGS
@given(
    queue=st.text(min_size=1, max_size=50),
    payload=st.binary(max_size=2000),
    headers=user_headers,
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    attempt=st.integers(1, MAX_ATTEMPT),
    lease_ms=st.integers(1, 12 * 3600 * 1000),
)
@example(  # every numeric field at its widest
    queue="q" * 50,
    payload=b"p",
    headers=(("h", b"v"),),
    partition=2**31 - 1,
    offset=2**63 - 1,
    attempt=MAX_ATTEMPT,
    lease_ms=12 * 3600 * 1000,
)
def test_start_marker_record_size_is_an_upper_bound(
    queue: str,
    payload: bytes,
    headers: tuple[tuple[str, bytes], ...],
    partition: int,
    offset: int,
    attempt: int,
    lease_ms: int,
) -> None:
    message_id = new_message_id()
    real = Marker(
        type=MarkerType.START,
        queue=queue,
        partition=partition,
        offset=offset,
        message_id=message_id,
        attempt=attempt,
        redeliver_after_ms=lease_ms,
        key=queue.encode(),
        value=payload,
        headers=headers,
    )
    # The marker record is keyed by the message id. The bound must hold even without the
    # allowance for Kafka's record framing, which the marker itself must not eat into.
    real_size = len(encode(real)) + len(message_id.encode())
    bound = start_marker_record_size(queue, message_id, payload, headers)
    assert bound - RECORD_OVERHEAD_BYTES >= real_size


def test_start_marker_record_size_grows_with_payload() -> None:
    small = start_marker_record_size("q", "m" * 32, b"", ())
    big = start_marker_record_size("q", "m" * 32, b"x" * 1000, ())
    assert big - small >= 1000
