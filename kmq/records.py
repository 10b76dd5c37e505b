"""How a kmq message is laid out in a queue-topic record, and how big its START marker gets."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from kmq.markers import MAX_ATTEMPT, Marker, MarkerType, encode

ID_HEADER = "kmq.id"
ATTEMPT_HEADER = "kmq.attempt"
DLQ_ORIGIN_HEADER = "kmq.dlq.origin"
DLQ_ATTEMPTS_HEADER = "kmq.dlq.attempts"
DLQ_REASON_HEADER = "kmq.dlq.reason"
DLQ_HEADERS = (DLQ_ORIGIN_HEADER, DLQ_ATTEMPTS_HEADER, DLQ_REASON_HEADER)

RECORD_OVERHEAD_BYTES = 256
"""Generous allowance for Kafka's record-batch header, record varints and the marker key."""

_MAX_INT32 = 2**31 - 1
_MAX_INT64 = 2**63 - 1


def new_message_id() -> str:
    """A fresh message id: 32 hex digits, random."""
    return uuid.uuid4().hex


def queue_headers(
    message_id: str, attempt: int, user_headers: Sequence[tuple[str, bytes]]
) -> list[tuple[str, bytes]]:
    return [(ID_HEADER, message_id.encode()), (ATTEMPT_HEADER, b"%d" % attempt), *user_headers]


def dead_letter_headers(
    message_id: str,
    origin_queue: str,
    attempts: int,
    reason: str,
    user_headers: Sequence[tuple[str, bytes]],
) -> list[tuple[str, bytes]]:
    """Headers of a dead letter: it starts at attempt 1 in its dead-letter queue and keeps
    where it came from, how many attempts it had there and the last reason given."""
    kept = [(k, v) for k, v in user_headers if k not in DLQ_HEADERS]
    return [
        *queue_headers(message_id, 1, kept),
        (DLQ_ORIGIN_HEADER, origin_queue.encode()),
        (DLQ_ATTEMPTS_HEADER, b"%d" % attempts),
        (DLQ_REASON_HEADER, reason.encode()),
    ]


def parse_queue_headers(
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> tuple[str | None, int, tuple[tuple[str, bytes], ...]]:
    """Split record headers into (message id, attempt, user headers).

    Records written by something other than kmq have no id; callers derive one.
    """
    message_id: str | None = None
    attempt = 1
    user: list[tuple[str, bytes]] = []
    for name, value in headers or ():
        if name == ID_HEADER and value:
            message_id = value.decode("utf-8", "replace")
        elif name == ATTEMPT_HEADER and value:
            try:
                attempt = min(max(1, int(value)), MAX_ATTEMPT)
            except ValueError:
                attempt = 1
        else:
            user.append((name, value or b""))
    return message_id, attempt, tuple(user)


def start_marker_record_size(
    queue: str, message_id: str, payload: bytes, headers: Sequence[tuple[str, bytes]]
) -> int:
    """Upper bound, in bytes, of the record carrying this message's START marker."""
    marker = Marker(
        type=MarkerType.START,
        queue=queue,
        partition=_MAX_INT32,
        offset=_MAX_INT64,
        message_id=message_id,
        attempt=_MAX_INT32,
        redeliver_after_ms=_MAX_INT64,
        key=queue.encode(),
        value=payload,
        headers=tuple(headers),
    )
    return len(encode(marker)) + len(message_id) + RECORD_OVERHEAD_BYTES
