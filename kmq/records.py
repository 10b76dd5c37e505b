"""How a kmq message is laid out in a queue-topic record."""

from __future__ import annotations

import os
from collections.abc import Sequence

from kmq.markers import MAX_ATTEMPT

MAX_REASON_CHARS = 1000
"""A reason (nack, reject, dead letter) keeps at most this many characters: it rides in
markers and dead-letter headers, which must stay well under the record size limit."""

ID_HEADER = "kmq.id"
ATTEMPT_HEADER = "kmq.attempt"
DLQ_ORIGIN_HEADER = "kmq.dlq.origin"
DLQ_ATTEMPTS_HEADER = "kmq.dlq.attempts"
DLQ_REASON_HEADER = "kmq.dlq.reason"
DLQ_HEADERS = (DLQ_ORIGIN_HEADER, DLQ_ATTEMPTS_HEADER, DLQ_REASON_HEADER)

RECORD_OVERHEAD_BYTES = 128
"""Generous allowance for a record's varints and its share of the batch header."""
_HEADER_OVERHEAD_BYTES = 10

_OFFSET_BITS = 44
_PARTITION_BITS = 15
MAX_PARTITION: int = 2**_PARTITION_BITS - 1
MAX_OFFSET: int = 2**_OFFSET_BITS - 1
_LANE_SHIFT = _OFFSET_BITS + _PARTITION_BITS


def delivery_key(lane: int, partition: int, offset: int) -> int:
    """One int naming a delivered record (an int is smaller than a tuple). Partitions up to
    32,767 and offsets below 2**44 fit; callers check with :func:`fits_key`."""
    return (lane << _LANE_SHIFT) | (partition << _OFFSET_BITS) | offset


def fits_key(partition: int, offset: int) -> bool:
    return 0 <= partition <= MAX_PARTITION and 0 <= offset <= MAX_OFFSET


def split_key(key: int) -> tuple[int, int, int]:
    """``(lane, partition, offset)`` of a :func:`delivery_key`."""
    return key >> _LANE_SHIFT, (key >> _OFFSET_BITS) & MAX_PARTITION, key & MAX_OFFSET


_IDS_PER_DRAW = 256
_ids: list[str] = []
"""Message ids drawn ahead. ``os.urandom`` lets go of the GIL for its system call, and one
call per ``send()`` handed the GIL to the producer's network thread on every message (a
thread switch each time: about 20 µs of CPU per message, measured). One call per 256 ids
keeps the ids from the operating system's random source at a 256th of the switches."""


def _draw_ids() -> list[str]:
    raw = os.urandom(16 * _IDS_PER_DRAW).hex()
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]


def new_message_id() -> str:
    """A fresh message id: 32 hex digits, random."""
    while True:
        try:
            return _ids.pop()  # atomic: threads never get the same id
        except IndexError:
            _ids.extend(_draw_ids())


# A forked child must not hand out the ids its parent drew ahead too.
os.register_at_fork(after_in_child=_ids.clear)


def queue_headers(
    message_id: str, attempt: int, user_headers: Sequence[tuple[str, bytes]]
) -> list[tuple[str, bytes]]:
    """A record's headers. The attempt header is left out on attempt 1 (its default)."""
    if attempt == 1:
        return [(ID_HEADER, message_id.encode()), *user_headers]
    return [(ID_HEADER, message_id.encode()), (ATTEMPT_HEADER, b"%d" % attempt), *user_headers]


def dead_letter_headers(
    message_id: str,
    origin_queue: str,
    attempts: int,
    reason: str,
    user_headers: Sequence[tuple[str, bytes]],
) -> list[tuple[str, bytes]]:
    """Headers of a dead letter: it starts at attempt 1 in its dead-letter queue and keeps
    where it came from, how many attempts it had there and the last reason given (its
    first :data:`MAX_REASON_CHARS` characters: a kmq 0.1 marker's reason had no limit)."""
    kept = [(k, v) for k, v in user_headers if k not in DLQ_HEADERS]
    return [
        *queue_headers(message_id, 1, kept),
        (DLQ_ORIGIN_HEADER, origin_queue.encode()),
        (DLQ_ATTEMPTS_HEADER, b"%d" % attempts),
        (DLQ_REASON_HEADER, reason[:MAX_REASON_CHARS].encode()),
    ]


def parse_queue_headers(
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> tuple[str | None, int, tuple[tuple[str, bytes], ...]]:
    """Split record headers into (message id, attempt, user headers).

    Records written by something other than kmq have no id; callers derive one.
    """
    if not headers:
        return None, 1, ()
    message_id: str | None = None
    attempt = 1
    user: list[tuple[str, bytes]] = []
    for name, value in headers:
        if name == ID_HEADER:
            if value:
                message_id = value.decode("utf-8", "replace")
        elif name == ATTEMPT_HEADER:
            if value:
                try:
                    attempt = min(max(1, int(value)), MAX_ATTEMPT)
                except ValueError:
                    attempt = 1
        else:
            user.append((name, value or b""))
    return message_id, attempt, tuple(user)


def record_size(key: bytes, payload: bytes, headers: Sequence[tuple[str, bytes]]) -> int:
    """Upper bound, in bytes, of a queue record carrying this message (any attempt)."""
    size = len(key) + len(payload) + RECORD_OVERHEAD_BYTES
    for name, value in (*headers, (ID_HEADER, b"x" * 64), (ATTEMPT_HEADER, b"4294967295")):
        size += len(name.encode()) + len(value) + _HEADER_OVERHEAD_BYTES
    return size
