"""A receive whose client hangs up after the proxy has handed its messages out, but before the
answer is written: the messages are released at once (a RELEASE marker each, same attempt),
not left to their leases. The race is made deterministic by running the proxy in this
process behind a wrapper that holds the answer's first byte until the client is gone."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import kmq
from kmq.markers import MarkerType
from kmq.proxy.app import create_app
from kmq.proxy.backend import Backend
from kmq.proxy.config import ProxyConfig
from tests.functional.conftest import Broker, RunningTracker, Topics
from tests.functional.helpers import read_markers, wait_until
from tests.functional.test_proxy_helpers import SECRET, make_topics, running_tracker, service

LEASE_S = 30
"""The gone client's lease: the message must be back long before it runs out."""
BACK_WITHIN_S = 8.0


class HoldAnswer:
    """Wraps the app: once armed, holds the next answer right before its first byte is
    written, until :meth:`let_go`; keeps what that answer then tried to write."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.armed = threading.Event()
        self.holding = threading.Event()
        self.done = threading.Event()
        self.written = bytearray()
        self._go = threading.Event()

    def let_go(self) -> None:
        self._go.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        mine = False

        async def held(message: Message) -> None:
            nonlocal mine
            if message["type"] == "http.response.start" and self.armed.is_set():
                self.armed.clear()
                mine = True
                self.holding.set()
                await asyncio.to_thread(self._go.wait, 30)
            if mine and message["type"] == "http.response.body":
                self.written += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive, held)
        finally:
            if mine:
                self.done.set()


class InProcessProxy:
    """One replica served by uvicorn on a thread of this process."""

    def __init__(self, svc: kmq.Service) -> None:
        config = ProxyConfig(secrets=(SECRET.encode(),), insecure_no_auth=True, threads=8)
        self.hold = HoldAnswer(create_app(config, Backend(svc, threads=8)))
        uv = uvicorn.Config(self.hold, host="127.0.0.1", port=0, log_config=None,
                            timeout_graceful_shutdown=10)  # fmt: skip
        self.server = uvicorn.Server(uv)
        self._thread = threading.Thread(target=self.server.run, name="proxy", daemon=True)
        self._thread.start()
        wait_until(lambda: self.server.started or not self._thread.is_alive(), 60, "uvicorn")
        assert self.server.started, "the in-process proxy did not start"
        self.port: int = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def connected(self, address: tuple[str, int]) -> bool:
        """Whether the server still has a connection from ``address``."""
        while True:
            try:
                connections = list(self.server.server_state.connections)
            except RuntimeError:  # the set changed while copied
                continue
            return any(getattr(c, "client", None) == address for c in connections)

    def stop(self) -> None:
        self.hold.let_go()
        self.server.should_exit = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the in-process proxy did not stop"


@pytest.fixture(scope="module")
def htopics(broker: Broker) -> Topics:
    return make_topics(broker, 2)


@pytest.fixture(scope="module")
def htracker(broker: Broker, htopics: Topics) -> Iterator[RunningTracker]:
    yield from running_tracker(broker, htopics)


@pytest.fixture
def proxy(broker: Broker, htopics: Topics, htracker: RunningTracker) -> Iterator[InProcessProxy]:
    running = InProcessProxy(service(broker, htopics))
    try:
        yield running
    finally:
        running.stop()


def _one_buffered_message(client: httpx.Client) -> tuple[str, str]:
    """A new queue with one message, which its consumer on the proxy holds: a receive now,
    even one that does not wait, gets it."""
    queue = f"h-{uuid.uuid4().hex[:8]}"
    first = client.post(f"/v1/queues/{queue}/receive", json={"max_messages": 1, "wait_s": 1})
    assert first.status_code == 200 and first.json()["messages"] == [], first.text
    sent = client.post(f"/v1/queues/{queue}/messages", json={"body": "aGk="})
    assert sent.status_code == 201, sent.text

    def ready() -> int:
        # Not in_flight: that counts a message from its START on, before its offset commit
        # is over and it is handed out, when a receive that does not wait still gets nothing.
        status = client.get("/v1/status").json()["queues"].get(queue, {})
        return int(status.get("ready", 0))

    wait_until(ready, 30, "the queue's consumer to have the message ready")
    return queue, str(sent.json()["id"])


def _hang_up_after_hand_off(proxy: InProcessProxy, head: str, body: bytes) -> bytes:
    """Send one receive on a raw socket; once its answer is held (its messages are handed
    out), hang up, wait for the server to see it, and let the answer go. Returns what the
    answer tried to write."""
    proxy.hold.armed.set()
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    try:
        address = sock.getsockname()
        sock.sendall(f"{head}Content-Length: {len(body)}\r\nHost: x\r\n\r\n".encode() + body)
        assert proxy.hold.holding.wait(30), "the receive never answered"
    finally:
        sock.close()
    wait_until(lambda: not proxy.connected(address), 10, "the server to see the hang-up")
    proxy.hold.let_go()
    assert proxy.hold.done.wait(30), "the held answer never finished"
    return bytes(proxy.hold.written)


def _back_soon(receive_one: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    started = time.monotonic()
    got = wait_until(receive_one, BACK_WITHIN_S + 2, "the released message")
    assert time.monotonic() - started < BACK_WITHIN_S, "it waited for the gone client's lease"
    return dict(got)


def _released(broker: Broker, topics: Topics, message_id: str) -> bool:
    return any(
        m.type == MarkerType.RELEASE and m.message_id == message_id
        for m in read_markers(broker.bootstrap_servers, topics)
    )


@pytest.mark.parametrize("wait_s", [0, 5])
def test_native_receive_answer_never_written_releases_its_messages(
    proxy: InProcessProxy, broker: Broker, htopics: Topics, wait_s: int
) -> None:
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        queue, message_id = _one_buffered_message(client)
        body = json.dumps({"max_messages": 10, "wait_s": wait_s, "visibility_s": LEASE_S})
        unsent = _hang_up_after_hand_off(
            proxy,
            f"POST /v1/queues/{queue}/receive HTTP/1.1\r\nContent-Type: application/json\r\n",
            body.encode(),
        )
        assert message_id.encode() in unsent, unsent

        def receive_one() -> dict[str, Any] | None:
            params = {"max_messages": 1, "wait_s": 1, "visibility_s": LEASE_S}
            r = client.post(f"/v1/queues/{queue}/receive", json=params)
            assert r.status_code == 200, r.text
            messages = r.json()["messages"]
            return messages[0] if messages else None

        again = _back_soon(receive_one)
        assert (again["id"], again["attempt"]) == (message_id, 1)
        assert _released(broker, htopics, message_id)
        ack = client.post(f"/v1/queues/{queue}/ack", json={"receipts": [again["receipt"]]})
        assert ack.status_code == 200, ack.text


def _sqs(client: httpx.Client, url: str, action: str, **params: Any) -> dict[str, Any]:
    r = client.post("/", content=json.dumps({"QueueUrl": url, **params}),
                    headers={"X-Amz-Target": f"AmazonSQS.{action}",
                             "Content-Type": "application/x-amz-json-1.0"})  # fmt: skip
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_sqs_receive_message_answer_never_written_releases_its_messages(
    proxy: InProcessProxy, broker: Broker, htopics: Topics
) -> None:
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        queue, message_id = _one_buffered_message(client)
        url = f"{proxy.url}/000000000000/{queue}"
        body = json.dumps({"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 10,
                           "VisibilityTimeout": LEASE_S})  # fmt: skip
        unsent = _hang_up_after_hand_off(
            proxy,
            "POST / HTTP/1.1\r\nX-Amz-Target: AmazonSQS.ReceiveMessage\r\n"
            "Content-Type: application/x-amz-json-1.0\r\n",
            body.encode(),
        )
        assert message_id.encode() in unsent, unsent

        def receive_one() -> dict[str, Any] | None:
            got = _sqs(client, url, "ReceiveMessage", WaitTimeSeconds=1,
                       VisibilityTimeout=LEASE_S,
                       MessageSystemAttributeNames=["ApproximateReceiveCount"])  # fmt: skip
            messages = got.get("Messages", [])
            return messages[0] if messages else None

        again = _back_soon(receive_one)
        assert again["MessageId"] == message_id
        assert again["Attributes"]["ApproximateReceiveCount"] == "1"
        assert _released(broker, htopics, message_id)
        _sqs(client, url, "DeleteMessage", ReceiptHandle=again["ReceiptHandle"])
