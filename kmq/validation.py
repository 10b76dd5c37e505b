"""Checks on what users pass to send(): queue ids, payloads, headers."""

from __future__ import annotations

from collections.abc import Mapping

from kmq.errors import InvalidMessageError, InvalidQueueError

MAX_QUEUE_ID_BYTES = 200
RESERVED_HEADER_PREFIX = "kmq."


def check_queue_id(queue: object) -> str:
    if not isinstance(queue, str):
        raise InvalidQueueError(f"queue id must be a str, got {type(queue).__name__}")
    if not queue:
        raise InvalidQueueError("queue id must not be empty")
    if any(c.isspace() or not c.isprintable() for c in queue):
        raise InvalidQueueError(f"queue id {queue!r} contains whitespace or control characters")
    if len(queue.encode("utf-8")) > MAX_QUEUE_ID_BYTES:
        raise InvalidQueueError(f"queue id is longer than {MAX_QUEUE_ID_BYTES} bytes of UTF-8")
    return queue


def check_payload(payload: object) -> bytes:
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload)
    if not isinstance(payload, bytes):
        raise InvalidMessageError(
            f"payload must be bytes, got {type(payload).__name__} (encode text yourself)"
        )
    return payload


def check_headers(headers: Mapping[str, bytes] | None) -> tuple[tuple[str, bytes], ...]:
    if headers is None:
        return ()
    if not isinstance(headers, Mapping):
        raise InvalidMessageError("headers must be a mapping of str to bytes")
    out: list[tuple[str, bytes]] = []
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidMessageError(f"header names must be non-empty str, got {name!r}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidMessageError(f"header name {name!r} is not valid UTF-8") from None
        if name.startswith(RESERVED_HEADER_PREFIX):
            raise InvalidMessageError(f"header {name!r}: names starting with 'kmq.' are reserved")
        if not isinstance(value, (bytes, bytearray)):
            raise InvalidMessageError(f"header {name!r} must have a bytes value")
        out.append((name, bytes(value)))
    return tuple(out)
