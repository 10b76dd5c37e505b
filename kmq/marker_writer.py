"""Writing markers: one background thread turns everything added since its last flush into
one record per markers partition, so markers from many threads share a broker round trip.

:meth:`MarkerWriter.add` is cheap (an append under a lock) and never touches the network:
callers may hold their own locks while adding, which is how a consumer keeps the markers of
one message in the order it decided them. The flusher thread sends in the order markers were
added, and the idempotent producer keeps that order per partition on the broker.

A flush goes out as soon as anyone waits for one (START markers, ``ack(wait=True)``), or
after ``linger_s`` otherwise (``ack(wait=False)``, keep-alives), or once ``flush_at`` markers
are pending. Everything added while a flush is being sent rides in the next one: that is the
group commit for acks from several threads.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from kmq.markers import ENTRY_BYTES, HEADER_BYTES, Entry, encode_entries

log = logging.getLogger(__name__)


def marker_partition(message_id: str, partitions: int) -> int:
    """The markers partition every marker of ``message_id`` goes to."""
    return zlib.crc32(message_id.encode()) % partitions


Headers = list[tuple[str, bytes]]


class _Producer(Protocol):
    """kafka-python's KafkaProducer; given ``headers=`` too when the writer has any."""

    def send(self, topic: str, *, key: bytes | None, value: bytes, partition: int) -> Any: ...


class Flush:
    """The outcome of one flush: which markers partitions failed, once it is over."""

    __slots__ = ("_done", "_lock", "_notify", "_remaining", "_sent", "errors")

    def __init__(self, notify: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._notify = notify
        self._remaining = 0
        self._sent = False
        self.errors: dict[int, BaseException] = {}

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None) -> bool:
        return self._done.wait(timeout_s)

    def error(self, partition: int) -> BaseException | None:
        return self.errors.get(partition)

    def _expect(self) -> None:
        with self._lock:
            self._remaining += 1

    def _finished(self, partition: int, exc: BaseException | None) -> None:
        with self._lock:
            if exc is not None:
                self.errors.setdefault(partition, exc)
            self._remaining -= 1
            if self._sent and self._remaining == 0:
                self._set_done()

    def _all_sent(self) -> None:
        with self._lock:
            self._sent = True
            if self._remaining == 0:
                self._set_done()

    def _set_done(self) -> None:
        self._done.set()
        if self._notify is not None:
            self._notify()


class MarkerWriter:
    """Collects markers per markers partition and writes them from a background thread."""

    def __init__(
        self,
        producer: _Producer,
        topic: str,
        partitions: int,
        max_record_bytes: int,
        *,
        linger_s: float = 0.02,
        flush_at: int = 256,
        name: str = "kmq-markers",
        on_flushed: Callable[[], None] | None = None,
        headers: Callable[[], Headers] | None = None,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self._producer = producer
        self._budget = max(ENTRY_BYTES + HEADER_BYTES, max_record_bytes // 2)
        self._linger_s = linger_s
        self._flush_at = flush_at
        self._cond = threading.Condition()
        self._pending: dict[int, list[Entry]] = {}
        self._texts: dict[int, list[bytes]] = {}
        self._count = 0
        self._first_at = 0.0
        self._urgent = False
        self._on_flushed = on_flushed
        """Called (on a Kafka I/O thread) whenever a flush is over."""
        self._headers = headers
        """The headers of every record a flush writes, asked once per flush."""
        self._flush = Flush(on_flushed)
        self._sent_at: dict[int, float] = {}
        """When a record last went to each markers partition (monotonic)."""
        self._taken: list[Flush] = []  # flushes being sent or answered
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def partition_for(self, message_id: str) -> int:
        return marker_partition(message_id, self.partitions)

    @property
    def pending(self) -> int:
        return self._count

    def quiet_partitions(self, since: float) -> list[int]:
        """The markers partitions no record went to since ``since`` (monotonic)."""
        sent_at = self._sent_at
        return [p for p in range(self.partitions) if sent_at.get(p, -math.inf) < since]

    def add(self, entry: Entry, partition: int, text: bytes = b"") -> Flush:
        """Queue one marker; returns the flush it will go out in."""
        with self._cond:
            if self._closing:
                raise RuntimeError("marker writer is closed")
            bucket = self._pending.get(partition)
            if bucket is None:
                bucket = self._pending[partition] = []
            bucket.append(entry)
            if text:
                self._texts.setdefault(partition, []).append(text)
            if not self._count:
                self._first_at = time.monotonic()
                self._cond.notify()
            self._count += 1
            if self._count >= self._flush_at:
                self._cond.notify()
            return self._flush

    def add_many(self, items: list[tuple[Entry, int]], text: bytes = b"") -> Flush:
        """Queue markers, given as (entry, markers partition), in order, all in one flush;
        ``text``, if any, is every entry's text (its length already in the entries)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("marker writer is closed")
            pending = self._pending
            for entry, partition in items:
                bucket = pending.get(partition)
                if bucket is None:
                    bucket = pending[partition] = []
                bucket.append(entry)
                if text:
                    self._texts.setdefault(partition, []).append(text)
            if not self._count:
                self._first_at = time.monotonic()
            self._count += len(items)
            self._cond.notify()
            return self._flush

    def flush_soon(self) -> None:
        """Send what is pending now instead of after the linger."""
        with self._cond:
            if self._count:
                self._urgent = True
                self._cond.notify()

    def sync(self, timeout_s: float | None) -> bool:
        """Send what is pending now and wait until everything added so far has been
        answered by the broker; True if all of it was written."""
        with self._cond:
            targets = list(self._taken)
            if self._count:
                targets.append(self._flush)
                self._urgent = True
                self._cond.notify()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for target in targets:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not target.wait(remaining) or target.errors:
                return False
        return True

    def close(self, timeout_s: float) -> bool:
        """Send everything pending, stop the thread; True if all of it reached the broker."""
        with self._cond:
            self._closing = True
            last = self._flush
            self._urgent = True
            self._cond.notify()
        self._thread.join(timeout_s)
        return last.wait(timeout_s) and not last.errors

    # -- the flusher thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._count:
                        if self._urgent or self._closing or self._count >= self._flush_at:
                            break
                        wait_s = self._first_at + self._linger_s - time.monotonic()
                        if wait_s <= 0:
                            break
                    elif self._closing:
                        self._flush._all_sent()
                        return
                    else:
                        wait_s = None
                    self._cond.wait(wait_s)
                pending, self._pending = self._pending, {}
                texts, self._texts = self._texts, {}
                flush, self._flush = self._flush, Flush(self._on_flushed)
                self._taken = [f for f in self._taken if not f.done]
                self._taken.append(flush)
                self._count = 0
                self._urgent = False
            try:
                self._send(pending, texts, flush)
            except Exception:  # never let the flusher die: waiters would hang
                log.exception("marker flush failed")
            finally:
                flush._all_sent()

    def _send(self, pending: dict[int, list[Entry]], texts: dict[int, list[bytes]],
              flush: Flush) -> None:  # fmt: skip
        headers = self._headers() if self._headers is not None else None
        extra: dict[str, Any] = {"headers": headers} if headers else {}
        now = time.monotonic()
        for partition, entries in pending.items():
            self._sent_at[partition] = now
            try:
                for chunk, chunk_texts in self._chunks(entries, texts.get(partition, [])):
                    value = encode_entries(chunk, chunk_texts)
                    future = self._producer.send(
                        self.topic, key=None, value=value, partition=partition, **extra
                    )
                    flush._expect()
                    future.add_callback(_ok, flush, partition)
                    future.add_errback(_failed, flush, partition, len(chunk))
            except Exception as exc:  # refused before it was sent (too large, buffer full)
                flush.errors.setdefault(partition, exc)
                log.error(
                    "markers for markers partition %d not written (%r); their messages are "
                    "redelivered when their leases run out",
                    partition, exc,
                )  # fmt: skip

    def _chunks(
        self, entries: list[Entry], texts: list[bytes]
    ) -> list[tuple[list[Entry], list[bytes]]]:
        if (len(entries) * ENTRY_BYTES + sum(map(len, texts))) <= self._budget:
            return [(entries, texts)]
        out: list[tuple[list[Entry], list[bytes]]] = [([], [])]
        size = 0
        text_iter = iter(texts)
        for entry in entries:
            text = next(text_iter) if entry[7] else b""
            cost = ENTRY_BYTES + len(text)
            if out[-1][0] and size + cost > self._budget:
                out.append(([], []))
                size = 0
            out[-1][0].append(entry)
            if text:
                out[-1][1].append(text)
            size += cost
        return out


# kafka-python calls a callback given extra arguments as f(*args, value).
def _ok(flush: Flush, partition: int, _: object) -> None:
    flush._finished(partition, None)


def _failed(flush: Flush, partition: int, count: int, exc: BaseException) -> None:
    log.error(
        "%d markers for markers partition %d not written (%r); their messages are "
        "redelivered when their leases run out",
        count, partition, exc,
    )  # fmt: skip
    flush._finished(partition, exc)
