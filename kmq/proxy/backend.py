"""The proxy's Kafka side, through kmq's public API only: one :class:`kmq.Service`, one
:class:`kmq.Settler`, and per queue one lazily created :class:`kmq.Consumer` whose messages
are handed to HTTP clients with :meth:`kmq.Consumer.hand_off_many`.

Per queue a *gate* thread serves the long polls waiting on that queue, first come first
served: it takes up to a waiter's ``max_messages`` from the consumer, hands them off for the
waiter's visibility timeout (from then on only the client's ack, extend or the tracker
decide their fate), and resolves the waiter's future on the event loop. A message taken
for a waiter that has gone meanwhile is kept (*stashed*, still kept alive by the consumer)
for the next waiter; one that was already handed off is released at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from kmq.consumer import Consumer
from kmq.errors import BrokerError, ConsumerClosedError, KmqError
from kmq.message import Message
from kmq.policy import RetryPolicy
from kmq.producer import Producer
from kmq.receipts import Receipt, Settler
from kmq.service import Service

log = logging.getLogger("kmq.proxy")

T = TypeVar("T")

_POLL_S = 0.05
"""How long a gate waits in receive_many before it looks at its waiters again."""
_GRACE_S = 1.0
"""A long poll's own timeout beyond its wait: the gate normally answers first."""
_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to an HTTP client."""

    receipt: Receipt
    payload: bytes
    headers: Mapping[str, bytes]
    timestamp_ms: int

    @property
    def message_id(self) -> str:
        return self.receipt.message_id

    @property
    def attempt(self) -> int:
        return self.receipt.attempt


class _Waiter:
    __slots__ = ("deadline", "future", "lease_s", "loop", "max_messages", "tried")

    def __init__(
        self,
        max_messages: int,
        lease_s: float,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[list[Delivery]],
    ) -> None:
        self.max_messages = max_messages
        self.lease_s = lease_s
        self.deadline = deadline
        self.loop = loop
        self.future = future
        self.tried = False
        """Served once: even a poll whose wait is over (``wait_s=0``) gets what is buffered."""

    def call(self, fn: Callable[..., object], *args: object) -> bool:
        """Run ``fn(*args)`` on the waiter's event loop; False if that loop is gone."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True


def _resolve(future: asyncio.Future[list[Delivery]], value: list[Delivery]) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[list[Delivery]], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class Backend:
    """Everything one proxy replica does with Kafka."""

    def __init__(
        self,
        service: Service,
        *,
        prefetch: int = 100,
        consumer_idle_s: float = 300.0,
        threads: int = 64,
        policy: RetryPolicy | None = None,
        counts_cache_s: float = 1.0,
    ) -> None:
        self.service = service
        self._prefetch = prefetch
        self._idle_s = consumer_idle_s
        self._policy = policy or RetryPolicy()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="kmq-proxy")
        self._lock = threading.Lock()
        self._gates: dict[str, _Gate] = {}
        self._producers: dict[str, Producer] = {}
        self._settler: Settler | None = None
        self._closed = False
        self.seen: set[str] = set()
        """Queues this replica has served since it started (ListQueues without --queues)."""
        self._counts: dict[str, tuple[float, int]] = {}
        self._counts_cache_s = counts_cache_s

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (blocking): topics, the shared producer, the settler."""
        self.service.ensure_topics()
        self.service.kafka_producer()
        self.service.marker_partition_count()
        self._settler = Settler(self.service)

    @property
    def settler(self) -> Settler:
        if self._settler is None:
            raise BrokerError("the proxy is not connected to Kafka yet")
        return self._settler

    def stop_waiting(self) -> None:
        """Answer every long poll now, with what it has (nothing): the server is stopping."""
        with self._lock:
            gates = list(self._gates.values())
        for gate in gates:
            gate.stop_waiting()

    def close(self, timeout_s: float = 30.0) -> None:
        """Release everything not handed out (buffered and stashed messages) and disconnect."""
        with self._lock:
            self._closed = True
            gates = list(self._gates.values())
        for gate in gates:
            gate.close()
        self._executor.shutdown(wait=True)
        if self._settler is not None:
            self._settler.close(timeout_s)
        self.service.close(timeout_s)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking Kafka call on the proxy's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(fn, *args, **kwargs))

    # -- sending ------------------------------------------------------------------------------

    def _producer(self, queue: str) -> Producer:
        with self._lock:
            producer = self._producers.get(queue)
            if producer is None:
                producer = self._producers[queue] = self.service.queue(queue).producer()
            self.seen.add(queue)
            return producer

    async def send(
        self, queue: str, items: Sequence[tuple[bytes, Mapping[str, bytes] | None]]
    ) -> list[str | BaseException]:
        """Send the items in one pipelined round (:meth:`kmq.Producer.send_many`); an id or
        the error for each, in order. Returns once the broker holds every one that succeeded."""
        producer = self._producer(queue)
        return list(await self.call(producer.send_many, items))

    # -- receiving ----------------------------------------------------------------------------

    def _gate(self, queue: str) -> _Gate:
        with self._lock:
            if self._closed:
                raise BrokerError("the proxy is shutting down")
            gate = self._gates.get(queue)
            if gate is None:
                gate = self._gates[queue] = _Gate(self, queue)
            self.seen.add(queue)
            return gate

    async def receive(
        self,
        queue: str,
        max_messages: int,
        wait_s: float,
        lease_s: float,
        gone: asyncio.Event | None = None,
    ) -> list[Delivery]:
        """Up to ``max_messages`` messages, each leased to the caller for ``lease_s``;
        waits up to ``wait_s`` for the first. Returns early (empty) once ``gone`` is set."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Delivery]] = loop.create_future()
        waiter = _Waiter(max_messages, lease_s, time.monotonic() + wait_s, loop, future)
        self._gate(queue).add(waiter)
        watch = asyncio.ensure_future(gone.wait()) if gone is not None else None
        try:
            waits: set[asyncio.Future[Any]] = {future} if watch is None else {future, watch}
            await asyncio.wait(waits, timeout=wait_s + _GRACE_S, return_when="FIRST_COMPLETED")
        finally:
            if watch is not None:
                watch.cancel()
            if not future.done():
                future.cancel()  # the gate skips it; anything handed off later is released
        if future.cancelled():
            return []
        return future.result()

    def deliver(self, future: asyncio.Future[list[Delivery]], deliveries: list[Delivery]) -> None:
        """On the event loop: hand ``deliveries`` to their waiter, or release them at once
        if it is gone."""
        if future.done():
            self.release_soon(deliveries, "client gone before its messages were handed out")
        else:
            future.set_result(deliveries)

    def release_soon(self, deliveries: Sequence[Delivery], reason: str) -> None:
        """Give messages back for immediate redelivery (same attempt), without waiting."""
        settler = self._settler
        if settler is None:
            return
        for d in deliveries:
            try:
                settler.release(d.receipt, reason, wait=False)
            except Exception as exc:  # the lease runs out instead
                log.warning("release of %s failed: %r", d.message_id, exc)

    # -- settling -----------------------------------------------------------------------------

    async def _each(self, fn: Callable[..., None], receipts: Sequence[Receipt], *args: Any) -> None:
        # Concurrent calls share the settler's broker round trips.
        if len(receipts) == 1:
            await self.call(fn, receipts[0], *args)
            return
        await asyncio.gather(*(self.call(fn, r, *args) for r in receipts))

    async def ack(self, receipts: Sequence[Receipt]) -> None:
        await self.call(self.settler.ack, list(receipts))

    async def nack(self, receipts: Sequence[Receipt], delay_s: float | None, reason: str) -> None:
        if delay_s is not None:
            await self._each(self.settler.nack, receipts, delay_s, reason)
            return
        backoff = self._policy.backoff_s
        await asyncio.gather(
            *(
                self.call(self.settler.nack, r, backoff(r.attempt, random.random), reason)
                for r in receipts
            )
        )

    async def extend(self, receipts: Sequence[Receipt], lease_s: float) -> None:
        await self._each(self.settler.extend, receipts, lease_s)

    async def release(self, receipts: Sequence[Receipt], reason: str = "released") -> None:
        await self._each(self.settler.release, receipts, reason)

    async def reject(self, receipts: Sequence[Receipt], reason: str) -> None:
        await self._each(self.settler.reject, receipts, reason)

    # -- what it knows --------------------------------------------------------------------------

    def status(self) -> dict[str, dict[str, int]]:
        """Per queue: waiting long polls, stashed and buffered messages."""
        with self._lock:
            gates = dict(self._gates)
        return {queue: gate.status() for queue, gate in sorted(gates.items())}

    async def approximate_waiting(self, queue: str) -> int:
        """Messages of ``queue`` no consumer has taken yet (see :mod:`kmq.proxy.counts`)."""
        from kmq.proxy.counts import waiting_messages

        cached = self._counts.get(queue)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self._counts_cache_s:
            return cached[1]
        count = await self.call(waiting_messages, self.service, queue)
        self._counts[queue] = (time.monotonic(), count)
        return count

    # -- used by gates ------------------------------------------------------------------------

    def consumer(self, queue: str) -> Consumer:
        """A new consumer of ``queue`` (blocking: it joins the queue's group)."""
        return self.service.queue(queue, self._policy).consumer(max_in_flight=self._prefetch)

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        try:
            self._executor.submit(fn, *args)
        except RuntimeError:  # shutting down: do it here
            fn(*args)

    @property
    def idle_s(self) -> float:
        return self._idle_s


class _Gate:
    """One queue's consumer and the long polls waiting on it."""

    def __init__(self, backend: Backend, queue: str) -> None:
        self.queue = queue
        self._backend = backend
        self._cond = threading.Condition()
        self._waiters: deque[_Waiter] = deque()
        self._stash: deque[Message] = deque()
        self._consumer: Consumer | None = None
        self._closed = False
        self._last_active = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"kmq-gate-{queue}", daemon=True)
        self._thread.start()

    def add(self, waiter: _Waiter) -> None:
        with self._cond:
            if self._closed:
                raise BrokerError("the proxy is shutting down")
            self._waiters.append(waiter)
            self._last_active = time.monotonic()
            self._cond.notify()

    def status(self) -> dict[str, int]:
        with self._cond:
            consumer = self._consumer
            waiting = sum(1 for w in self._waiters if not w.future.done())
            out = {"waiting": waiting, "stashed": len(self._stash)}
        out["consumer"] = int(consumer is not None)
        out["in_flight"] = consumer.in_flight if consumer is not None else 0
        out["ready"] = consumer.ready if consumer is not None else 0
        return out

    def stop_waiting(self) -> None:
        with self._cond:
            waiters, self._waiters = list(self._waiters), deque()
        for w in waiters:
            w.call(_resolve, w.future, [])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    # -- the gate thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                waiter = self._next()
                if waiter is None:
                    return
                if waiter is _IDLE:
                    continue
                self._serve(waiter)
        except Exception:
            log.exception("queue %r: gate failed", self.queue)
        finally:
            self.stop_waiting()
            self._shut_consumer()

    def _next(self) -> _Waiter | None:
        """The waiter to serve next; ``None`` once closed; ``_IDLE`` after a quiet spell."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                now = time.monotonic()
                while self._waiters:
                    w = self._waiters[0]
                    if w.future.done():
                        self._waiters.popleft()
                    elif now >= w.deadline and w.tried:
                        self._waiters.popleft()
                        w.call(_resolve, w.future, [])
                    else:
                        return w
                idle_for = now - self._last_active
                if (
                    self._consumer is not None
                    and not self._stash
                    and idle_for >= self._backend.idle_s
                ):
                    break
                wait_s = self._backend.idle_s - idle_for if self._consumer is not None else None
                self._cond.wait(None if wait_s is None else max(0.01, min(wait_s, 5.0)))
        log.info("queue %r: no receive for %.0f s, closing its consumer", self.queue, idle_for)
        self._shut_consumer()
        return _IDLE

    def _serve(self, waiter: _Waiter) -> None:
        waiter.tried = True
        consumer = self._consumer
        if consumer is None:
            try:
                consumer = self._consumer = self._backend.consumer(self.queue)
            except KmqError as exc:
                log.warning("queue %r: cannot start its consumer: %r", self.queue, exc)
                self._fail_all(exc)
                return
        taken: list[Message] = []
        with self._cond:
            while self._stash and len(taken) < waiter.max_messages:
                taken.append(self._stash.popleft())
        if len(taken) < waiter.max_messages:
            timeout_s = 0.0 if taken else max(0.0, min(_POLL_S, waiter.deadline - time.monotonic()))
            try:
                taken += consumer.receive_many(waiter.max_messages - len(taken), timeout_s)
            except ConsumerClosedError as exc:
                log.warning("queue %r: consumer failed (%r); starting a new one", self.queue, exc)
                with self._cond:
                    self._stash.extendleft(reversed(taken))
                self._shut_consumer()
                self._fail_all(BrokerError(f"consumer of queue {self.queue!r} failed"))
                return
        if not taken:
            return
        with self._cond:
            if self._waiters and self._waiters[0] is waiter and not waiter.future.done():
                self._waiters.popleft()
            else:  # it went away meanwhile: keep them for the next one
                self._stash.extendleft(reversed(taken))
                return
        self._backend.submit(self._hand_off, consumer, waiter, taken)

    def _hand_off(self, consumer: Consumer, waiter: _Waiter, messages: list[Message]) -> None:
        try:
            receipts = consumer.hand_off_many(messages, waiter.lease_s)
        except KmqError as exc:  # their leases run out and the tracker redelivers them
            log.warning("queue %r: hand-off failed: %r", self.queue, exc)
            waiter.call(_fail, waiter.future, BrokerError(f"hand-off failed: {exc}"))
            return
        deliveries = [
            Delivery(r, m.payload, m.headers, m.timestamp_ms)
            for r, m in zip(receipts, messages, strict=True)
        ]
        if not waiter.call(self._backend.deliver, waiter.future, deliveries):
            self._backend.release_soon(deliveries, "proxy stopping")

    def _fail_all(self, exc: BaseException) -> None:
        """Fail every waiting long poll with ``exc``, then back off before trying again."""
        with self._cond:
            waiters, self._waiters = list(self._waiters), deque()
        for w in waiters:
            w.call(_fail, w.future, exc)
        with self._cond:
            if not self._closed:
                self._cond.wait(_RETRY_S)

    def _shut_consumer(self) -> None:
        """Release the stash (same attempt) and close the consumer (which releases what it
        buffered)."""
        with self._cond:
            consumer, self._consumer = self._consumer, None
            stash, self._stash = list(self._stash), deque()
        if consumer is None:
            return
        if stash:
            try:
                receipts = consumer.hand_off_many(stash, 60.0)
                for r in receipts:
                    self._backend.settler.release(r, "proxy consumer closed", wait=False)
            except KmqError as exc:
                log.warning("queue %r: releasing %d stashed messages failed: %r",
                            self.queue, len(stash), exc)  # fmt: skip
        with contextlib.suppress(Exception):
            consumer.close()


_IDLE = _Waiter.__new__(_Waiter)
"""What :meth:`_Gate._next` returns after closing an idle consumer."""


class KafkaSide(Protocol):
    """What the HTTP layer needs of :class:`Backend` (tests put a fake in its place)."""

    seen: set[str]

    def start(self) -> None: ...

    def stop_waiting(self) -> None: ...

    def close(self, timeout_s: float = 30.0) -> None: ...

    async def send(
        self, queue: str, items: Sequence[tuple[bytes, Mapping[str, bytes] | None]]
    ) -> list[str | BaseException]: ...

    async def receive(
        self,
        queue: str,
        max_messages: int,
        wait_s: float,
        lease_s: float,
        gone: asyncio.Event | None = None,
    ) -> list[Delivery]: ...

    def release_soon(self, deliveries: Sequence[Delivery], reason: str) -> None: ...

    async def ack(self, receipts: Sequence[Receipt]) -> None: ...

    async def nack(
        self, receipts: Sequence[Receipt], delay_s: float | None, reason: str
    ) -> None: ...

    async def extend(self, receipts: Sequence[Receipt], lease_s: float) -> None: ...

    async def release(self, receipts: Sequence[Receipt], reason: str = "released") -> None: ...

    async def reject(self, receipts: Sequence[Receipt], reason: str) -> None: ...

    def status(self) -> dict[str, dict[str, int]]: ...

    async def approximate_waiting(self, queue: str) -> int: ...
