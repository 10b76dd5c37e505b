"""Queue pause, stored in Kafka itself: a compacted control topic keyed by queue id.

While a queue is paused its consumers hand out nothing new and the tracker holds its
redeliveries. A pause ends at its ``until`` time (wall clock) or on resume.
"""

from __future__ import annotations

import json


def encode_pause(until_ms: int) -> bytes:
    return json.dumps({"paused_until_ms": int(until_ms)}).encode()


def decode_pause(value: bytes | None) -> int:
    """The pause end in epoch ms; 0 when not paused or unreadable (never pause on garbage)."""
    if not value:
        return 0
    try:
        until = json.loads(value)["paused_until_ms"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return 0
    return until if isinstance(until, int) and not isinstance(until, bool) else 0


class PauseTable:
    """Latest pause per queue, as read from the control topic. Pure: no I/O, time passed in."""

    def __init__(self) -> None:
        self._until_ms: dict[str, int] = {}

    def apply(self, queue: str, value: bytes | None) -> None:
        until = decode_pause(value)
        if until:
            self._until_ms[queue] = until
        else:
            self._until_ms.pop(queue, None)

    def paused_until_ms(self, queue: str, now_ms: int) -> int:
        """The pause's end if ``queue`` is paused at ``now_ms``, else 0."""
        until = self._until_ms.get(queue, 0)
        return until if until > now_ms else 0
