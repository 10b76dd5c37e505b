"""Stand-ins for kafka-python producers: they record what they are asked and raise
kafka.errors exceptions on demand. No network, no threads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka.future import Future


@dataclass(frozen=True)
class Sent:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] | None
    partition: int | None


@dataclass(frozen=True)
class Landed:
    """What a stub send's future resolves to: the fields of kafka-python's RecordMetadata
    that kmq reads."""

    topic: str
    partition: int
    offset: int


@dataclass
class StubTxnProducer:
    """A transactional producer. ``fail`` maps a method name (``init_transactions``,
    ``begin_transaction``, ``flush``, ``send_offsets_to_transaction``, ``commit_transaction``,
    ``abort_transaction``, ``close``) to what it raises; ``fail_sends`` maps the index of a
    ``send`` call (0 for the first) to what that call raises, ``fail_futures`` to the error
    its future fails with (as kafka-python reports a fenced or refused produce), and
    ``unplaced`` names the sends whose future gives no offset."""

    transactional_id: str = ""
    fail: Mapping[str, BaseException] = field(default_factory=dict)
    fail_sends: Mapping[int, BaseException] = field(default_factory=dict)
    fail_futures: Mapping[int, BaseException] = field(default_factory=dict)
    unplaced: frozenset[int] = frozenset()
    """Indexes of ``send`` calls whose future says offset -1, as kafka-python does when a
    retried write found its records already written (the embedded broker's answer)."""
    calls: list[str] = field(default_factory=list)
    """Every call, in order (``send`` included, even when it raised)."""
    sent: list[Sent] = field(default_factory=list)
    """The sends that did not raise."""
    offsets: list[tuple[dict[Any, Any], Any]] = field(default_factory=list)
    closed_with: list[float | None] = field(default_factory=list)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        exc = self.fail.get(name)
        if exc is not None:
            raise exc

    def init_transactions(self) -> None:
        self._call("init_transactions")

    def begin_transaction(self) -> None:
        self._call("begin_transaction")

    def send(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes,
        headers: list[tuple[str, bytes]] | None = None,
        partition: int | None = None,
    ) -> Future:
        index = self.calls.count("send")
        self.calls.append("send")
        exc = self.fail_sends.get(index)
        if exc is not None:
            raise exc
        failed = self.fail_futures.get(index)
        if failed is not None:
            return Future().failure(failed)
        self.sent.append(Sent(topic, key, value, headers, partition))
        # Like RecordMetadata: where it landed, each partition's offsets counting from 0.
        offset = sum(1 for s in self.sent[:-1] if (s.topic, s.partition) == (topic, partition))
        if index in self.unplaced:
            offset = -1
        return Future().success(Landed(topic, partition if partition is not None else 0, offset))

    def flush(self, timeout: float | None = None) -> None:
        self._call("flush")

    def send_offsets_to_transaction(self, offsets: dict[Any, Any], group_metadata: Any) -> None:
        self._call("send_offsets_to_transaction")
        self.offsets.append((offsets, group_metadata))

    def commit_transaction(self) -> None:
        self._call("commit_transaction")

    def abort_transaction(self) -> None:
        self._call("abort_transaction")

    def close(self, timeout: float | None = None) -> None:
        self.closed_with.append(timeout)
        self._call("close")
