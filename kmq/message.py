"""A received message and how it is settled."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.errors import InvalidArgumentError
from kmq.records import MAX_REASON_CHARS


class State(enum.Enum):
    BUFFERED = "buffered"  # STARTed, waiting in the consumer for receive()
    HELD = "held"  # handed to the application
    ACKED = "acked"
    NACKED = "nacked"
    REJECTED = "rejected"
    RELEASED = "released"
    HANDED_OFF = "handed off"  # its lease follows a Receipt now (see Consumer.hand_off)


class _Settler(Protocol):
    def _settle(
        self, message: Message, state: State, delay_ms: int | None, reason: str, wait: bool
    ) -> None: ...


class Message:
    """One delivery of a queued message. Settle it exactly once: :meth:`ack`, :meth:`nack`
    or :meth:`reject`."""

    __slots__ = (
        "_consumer",
        "_headers",
        "_raw_headers",
        "_state",
        "_taken_at",
        "attempt",
        "id",
        "key",
        "lane",
        "marker_partition",
        "offset",
        "partition",
        "payload",
        "queue",
        "timestamp_ms",
    )
    _taken_at: float
    """When ``receive()`` handed it out; set only when :mod:`kmq.metrics` is on."""

    def __init__(
        self,
        consumer: _Settler,
        *,
        payload: bytes,
        message_id: str,
        queue: str,
        attempt: int,
        headers: Mapping[str, bytes] | Sequence[tuple[str, bytes]],
        partition: int,
        offset: int,
        timestamp_ms: int,
        lane: int = 0,
    ) -> None:
        self._consumer = consumer
        self._state = State.BUFFERED
        self.payload = payload
        self.id = message_id
        self.queue = queue
        self.attempt = attempt
        self._raw_headers = tuple(headers.items()) if isinstance(headers, Mapping) else headers
        self._headers: Mapping[str, bytes] | None = None
        self.partition = partition
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.lane = lane
        """Which topic the record is on: 0 the queue topic, 1 the retry topic."""
        self.key = 0
        self.marker_partition = 0

    @classmethod
    def _make(
        cls,
        consumer: _Settler,
        payload: bytes,
        message_id: str,
        queue: str,
        attempt: int,
        headers: Sequence[tuple[str, bytes]],
        partition: int,
        offset: int,
        timestamp_ms: int,
        lane: int,
        key: int,
        marker_partition: int,
    ) -> Message:
        """The consumer's fast path: no keyword arguments, no checks."""
        m = cls.__new__(cls)
        m._consumer = consumer
        m._state = State.BUFFERED
        m.payload = payload
        m.id = message_id
        m.queue = queue
        m.attempt = attempt
        m._raw_headers = headers
        m._headers = None
        m.partition = partition
        m.offset = offset
        m.timestamp_ms = timestamp_ms
        m.lane = lane
        m.key = key
        m.marker_partition = marker_partition
        return m

    @property
    def headers(self) -> Mapping[str, bytes]:
        """Your headers, as sent (read-only)."""
        if self._headers is None:
            self._headers = MappingProxyType(dict(self._raw_headers))
        return self._headers

    @property
    def state(self) -> State:
        return self._state

    def ack(self, *, wait: bool = True) -> None:
        """Done with it: it will never be redelivered.

        Returns once the broker has the END marker. With ``wait=False`` it returns at once
        (faster); a crash before the END is written then means one more delivery.
        """
        self._consumer._settle(self, State.ACKED, 0, "", wait)

    def nack(self, delay_s: float | None = None, reason: str = "", *, wait: bool = True) -> None:
        """Give it back: it is redelivered after ``delay_s`` seconds with ``attempt + 1``.

        ``reason`` (kept to its first 1,000 characters) travels with the message: onto the
        tracker's REDELIVERED marker and, once it is dead-lettered, into the dead letter.
        Without ``delay_s`` the queue's :class:`kmq.RetryPolicy` picks a jittered exponential
        backoff. Past the policy's ``max_attempts`` it goes to the dead-letter queue instead.
        ``wait`` as for :meth:`ack`.
        """
        delay_ms: int | None = None
        if delay_s is not None:
            if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)):
                raise InvalidArgumentError(f"delay_s must be a number, got {delay_s!r}")
            if not 0 <= delay_s <= MAX_REDELIVERY_TIMEOUT_S:  # also rejects NaN and infinities
                raise InvalidArgumentError(
                    f"delay_s must be within [0, {MAX_REDELIVERY_TIMEOUT_S:g}], got {delay_s!r}"
                )
            delay_ms = round(delay_s * 1000)
        self._consumer._settle(self, State.NACKED, delay_ms, _reason(reason), wait)

    def reject(self, reason: str = "rejected", *, wait: bool = True) -> None:
        """Move it to the queue's dead-letter queue now, keeping payload, headers, id, attempt
        count, origin queue and ``reason`` (kept to its first 1,000 characters)."""
        self._consumer._settle(self, State.REJECTED, 0, _reason(reason), wait)

    def __repr__(self) -> str:
        return (
            f"<kmq.Message id={self.id} queue={self.queue!r} attempt={self.attempt} "
            f"at={self.partition}:{self.offset} {self._state.value}>"
        )


def _reason(reason: object) -> str:
    if not isinstance(reason, str):
        raise InvalidArgumentError(f"reason must be a str, got {type(reason).__name__}")
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"
