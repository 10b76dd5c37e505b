"""Settling a message from anywhere: a :class:`Receipt` names one delivery, and a
:class:`Settler` writes its END, NACK, KEEPALIVE, RELEASE or REJECT marker from any
process (another proxy replica, say), with no consumer involved.

A consumer hands a message over with :meth:`kmq.Consumer.hand_off`: from then on its lease
follows whoever holds the receipt (nothing keeps it alive but :meth:`Settler.extend`), and
if nobody settles it in time the tracker redelivers it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.errors import BrokerError, InvalidArgumentError
from kmq.marker_writer import Flush, MarkerWriter
from kmq.markers import LANES, MarkerType
from kmq.records import MAX_REASON_CHARS

if TYPE_CHECKING:
    from kmq.service import Service

_PACK = struct.Struct(">BBiqII")
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Receipt:
    """One delivery of one message: all a settler needs to write its markers."""

    queue: str
    message_id: str
    lane: int
    partition: int
    offset: int
    attempt: int
    marker_partition: int

    def encode(self) -> bytes:
        """Compact bytes (a proxy signs these into its receipt handles)."""
        head = _PACK.pack(
            _VERSION, self.lane, self.partition, self.offset, self.attempt, self.marker_partition
        )
        queue, mid = self.queue.encode(), self.message_id.encode()
        return head + struct.pack(">H", len(queue)) + queue + mid

    @classmethod
    def decode(cls, data: bytes) -> Receipt:
        """Raises :class:`kmq.InvalidArgumentError` for anything :meth:`encode` did not make."""
        try:
            version, lane, partition, offset, attempt, marker_partition = _PACK.unpack_from(data)
            (size,) = struct.unpack_from(">H", data, _PACK.size)
            start = _PACK.size + 2
            queue = data[start : start + size].decode()
            mid = data[start + size :].decode()
        except (struct.error, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"not a receipt: {exc}") from None
        if version != _VERSION or lane not in LANES or partition < 0 or offset < 0:
            raise InvalidArgumentError("not a receipt of this kmq version")
        if not queue or not mid or len(data) != start + size + len(mid.encode()):
            raise InvalidArgumentError("not a receipt: truncated")
        return cls(queue, mid, lane, partition, offset, attempt, marker_partition)


def _lease_ms(seconds: float, what: str, minimum: float) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgumentError(f"{what} must be a number of seconds, got {seconds!r}")
    if not minimum <= seconds <= MAX_REDELIVERY_TIMEOUT_S:  # also rejects NaN and infinities
        raise InvalidArgumentError(
            f"{what} must be within [{minimum:g}, {MAX_REDELIVERY_TIMEOUT_S:g}] s, got {seconds!r}"
        )
    return max(1, round(seconds * 1000)) if minimum > 0 else round(seconds * 1000)


def _text(reason: str) -> bytes:
    if not isinstance(reason, str):
        raise InvalidArgumentError(f"reason must be a str, got {type(reason).__name__}")
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 1] + "…"
    return reason.encode()


class Settler:
    """Writes markers for receipts, from any process that can reach the service's Kafka.
    Markers added by several threads share broker round trips. Close it when done."""

    def __init__(self, service: Service, *, linger_s: float = 0.005) -> None:
        cfg = service.config
        self._timeout_s = cfg.request_timeout_ms / 1000
        self._writer = MarkerWriter(
            service.kafka_producer(),
            cfg.marker_topic,
            service.marker_partition_count(),
            cfg.max_message_bytes,
            linger_s=linger_s,
            name="kmq-settler",
        )

    def ack(self, receipts: Receipt | Sequence[Receipt], *, wait: bool = True) -> None:
        """Done: never redelivered."""
        items = [receipts] if isinstance(receipts, Receipt) else list(receipts)
        self._write(MarkerType.END, items, 0, b"", wait)

    def nack(
        self, receipt: Receipt, delay_s: float = 0.0, reason: str = "", *, wait: bool = True
    ) -> None:
        """Give it back: redelivered after ``delay_s`` with ``attempt + 1``."""
        delay_ms = _lease_ms(delay_s, "delay_s", 0.0)
        self._write(MarkerType.NACK, [receipt], delay_ms, _text(reason), wait)

    def extend(self, receipt: Receipt, lease_s: float, *, wait: bool = True) -> None:
        """The holder needs it for ``lease_s`` more seconds, from now."""
        self._write(MarkerType.KEEPALIVE, [receipt], _lease_ms(lease_s, "lease_s", 0.001), b"",
                    wait)  # fmt: skip

    def release(self, receipt: Receipt, reason: str = "released", *, wait: bool = True) -> None:
        """Give it back unprocessed: redelivered at once, with the same attempt."""
        self._write(MarkerType.RELEASE, [receipt], 0, _text(reason), wait)

    def reject(self, receipt: Receipt, reason: str = "rejected", *, wait: bool = True) -> None:
        """Move it to its dead-letter queue (the tracker writes the dead letter)."""
        self._write(MarkerType.REJECT, [receipt], 0, _text(reason), wait)

    def _write(
        self, kind: MarkerType, receipts: list[Receipt], after_ms: int, text: bytes, wait: bool
    ) -> None:
        flush: Flush | None = None
        for r in receipts:
            entry = (int(kind), r.lane, r.partition, r.offset, r.attempt, after_ms, 0, len(text))
            flush = self._writer.add(entry, r.marker_partition, text)
        if flush is None or not wait:
            return
        self._writer.flush_soon()
        if not flush.wait(self._timeout_s):
            raise BrokerError(f"{kind.name} not acknowledged in {self._timeout_s:g} s")
        for r in receipts:
            exc = flush.error(r.marker_partition)
            if exc is not None:
                raise BrokerError(f"{kind.name} of {r.message_id} not written ({exc!r})") from exc

    def close(self, timeout_s: float = 10.0) -> None:
        self._writer.close(timeout_s)
