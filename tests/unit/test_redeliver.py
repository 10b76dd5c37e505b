"""What copy a due delivery becomes (tracker.redeliver.copy_of): its attempt, or its dead
letter, from the re-read record and the START's settings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.markers import MAX_ATTEMPT, QUEUE_LANE, RETRY_LANE
from kmq.policy import DEAD_LETTER_SUFFIX
from kmq.records import ATTEMPT_HEADER, ID_HEADER, delivery_key, queue_headers
from tracker.redeliver import copy_of
from tracker.reread import Record
from tracker.state import Due

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
