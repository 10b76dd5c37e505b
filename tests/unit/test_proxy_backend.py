"""A queue's gate with a fake consumer: long polls served first come first served, clients
that leave take nothing with them, and what a replica held is given back when it stops."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

import kmq
from kmq.errors import BrokerError
from kmq.proxy.backend import Backend, Delivery
from kmq.receipts import Receipt


@dataclass
class FakeMessage:
    id: str
    payload: bytes = b"p"
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 1


def receipt_of(m: FakeMessage) -> Receipt:
    return Receipt("q", m.id, 0, 0, int(m.id), 1, 0)


class FakeConsumer:
    def __init__(self) -> None:
        self.incoming: queue.Queue[FakeMessage] = queue.Queue()
        self.handed: list[tuple[list[str], float]] = []
        self.closed = threading.Event()

    def receive_many(self, max_messages: int, timeout_s: float) -> list[FakeMessage]:
        try:
            out = [self.incoming.get(timeout=timeout_s or 0.001)]
        except queue.Empty:
            return []
        while len(out) < max_messages:
            try:
                out.append(self.incoming.get_nowait())
            except queue.Empty:
                break
        return out

    def hand_off_many(self, messages: Sequence[FakeMessage], lease_s: float) -> list[Receipt]:
        self.handed.append(([m.id for m in messages], lease_s))
        return [receipt_of(m) for m in messages]

    @property
    def in_flight(self) -> int:
        return self.incoming.qsize()

    @property
    def ready(self) -> int:
        return self.incoming.qsize()

    def close(self, timeout_s: float = 30.0) -> None:
        self.closed.set()


class FakeSettler:
    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, receipt: Receipt, reason: str = "", *, wait: bool = True) -> None:
        self.released.append(receipt.message_id)

    def close(self, timeout_s: float = 10.0) -> None:
        pass


class GateBackend(Backend):
    def __init__(self, fail: BaseException | None = None, idle_s: float = 300.0) -> None:
        super().__init__(
            kmq.Service(bootstrap_servers="127.0.0.1:1"), threads=4, consumer_idle_s=idle_s
        )
        self.fake = FakeConsumer()
        self.fake_settler = FakeSettler()
        self._settler = cast(kmq.Settler, self.fake_settler)
        self.fail = fail

    def consumer(self, queue: str) -> kmq.Consumer:
        if self.fail is not None:
            raise self.fail
        return cast(kmq.Consumer, self.fake)


@pytest.fixture
def backend() -> Any:
    b = GateBackend()
    yield b
    b.close(1.0)


def ids(deliveries: list[Delivery]) -> list[str]:
    return [d.message_id for d in deliveries]


async def wait_for_waiters(backend: Backend, count: int) -> None:
    for _ in range(400):
        if backend.status().get("q", {}).get("waiting") == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never {count} waiters: {backend.status()}")


def test_long_polls_are_served_in_arrival_order(backend: GateBackend) -> None:
    async def main() -> list[list[Delivery]]:
        polls = []
        for _ in range(5):
            polls.append(asyncio.ensure_future(backend.receive("q", 1, 5.0, 7.0)))
            await wait_for_waiters(backend, len(polls))
        for i in range(5):
            backend.fake.incoming.put(FakeMessage(str(i)))
        return list(await asyncio.gather(*polls))

    results = asyncio.run(main())
    assert [ids(r) for r in results] == [["0"], ["1"], ["2"], ["3"], ["4"]]
    assert all(lease == 7.0 for _, lease in backend.fake.handed)


def test_a_poll_takes_what_is_buffered_up_to_its_maximum(backend: GateBackend) -> None:
    for i in range(5):
        backend.fake.incoming.put(FakeMessage(str(i)))
    got = asyncio.run(backend.receive("q", 3, 1.0, 7.0))
    assert ids(got) == ["0", "1", "2"]
    assert ids(asyncio.run(backend.receive("q", 10, 1.0, 7.0))) == ["3", "4"]


def test_a_short_poll_gets_what_is_buffered_without_waiting(backend: GateBackend) -> None:
    asyncio.run(backend.receive("q", 1, 0.05, 7.0))  # the gate and its consumer are up
    for i in range(3):
        backend.fake.incoming.put(FakeMessage(str(i)))
    assert ids(asyncio.run(backend.receive("q", 2, 0.0, 7.0))) == ["0", "1"]
    assert ids(asyncio.run(backend.receive("q", 10, 0.0, 7.0))) == ["2"]
    assert asyncio.run(backend.receive("q", 10, 0.0, 7.0)) == []


def test_an_empty_long_poll_returns_after_its_wait(backend: GateBackend) -> None:
    async def main() -> tuple[list[Delivery], float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await backend.receive("q", 1, 0.3, 7.0)
        return got, loop.time() - started

    got, took = asyncio.run(main())
    assert got == [] and 0.25 <= took < 1.2


def test_a_client_that_left_is_skipped(backend: GateBackend) -> None:
    async def main() -> list[Delivery]:
        gone = asyncio.Event()
        leaving = asyncio.ensure_future(backend.receive("q", 1, 5.0, 7.0, gone))
        await wait_for_waiters(backend, 1)
        staying = asyncio.ensure_future(backend.receive("q", 1, 5.0, 7.0))
        await wait_for_waiters(backend, 2)
        gone.set()
        assert await leaving == []
        backend.fake.incoming.put(FakeMessage("1"))
        return await staying

    assert ids(asyncio.run(main())) == ["1"]
    assert backend.fake_settler.released == []


def test_messages_handed_off_to_a_client_that_left_are_released_at_once(
    backend: GateBackend,
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Delivery]] = loop.create_future()
        future.cancel()
        backend.deliver(future, [Delivery(receipt_of(FakeMessage("9")), b"", {}, 1)])
        alive: asyncio.Future[list[Delivery]] = loop.create_future()
        backend.deliver(alive, [Delivery(receipt_of(FakeMessage("8")), b"", {}, 1)])
        assert ids(alive.result()) == ["8"]

    asyncio.run(main())
    assert backend.fake_settler.released == ["9"]


def test_stopping_answers_every_long_poll(backend: GateBackend) -> None:
    async def main() -> list[list[Delivery]]:
        polls = [asyncio.ensure_future(backend.receive("q", 1, 15.0, 7.0)) for _ in range(3)]
        await wait_for_waiters(backend, 3)
        backend.stop_waiting()
        return list(await asyncio.wait_for(asyncio.gather(*polls), 2.0))

    assert asyncio.run(main()) == [[], [], []]


def test_closing_releases_the_stash_and_closes_the_consumer() -> None:
    b = GateBackend()
    asyncio.run(b.receive("q", 1, 0.05, 7.0))  # starts the gate and its consumer
    gate = b._gates["q"]
    gate._stash.append(cast(kmq.Message, FakeMessage("5")))
    b.close(1.0)
    assert b.fake.closed.is_set()
    assert b.fake.handed[-1][0] == ["5"] and b.fake_settler.released == ["5"]


def test_an_idle_consumer_is_closed_and_a_new_one_started_on_demand() -> None:
    b = GateBackend(idle_s=0.1)
    try:
        asyncio.run(b.receive("q", 1, 0.01, 7.0))
        assert b.fake.closed.wait(3.0)
        b.fake = FakeConsumer()
        b.fake.incoming.put(FakeMessage("1"))
        assert ids(asyncio.run(b.receive("q", 1, 2.0, 7.0))) == ["1"]
    finally:
        b.close(1.0)


def test_a_consumer_that_cannot_start_fails_the_waiting_polls() -> None:
    b = GateBackend(fail=BrokerError("no Kafka"))
    try:
        with pytest.raises(BrokerError, match="no Kafka"):
            asyncio.run(b.receive("q", 1, 5.0, 7.0))
    finally:
        b.close(1.0)
