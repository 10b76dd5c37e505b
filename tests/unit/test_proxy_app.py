"""The HTTP layer against a fake backend (no Kafka): credentials are checked before
anything is read or written, bad requests get clear 4xx JSON, handles are verified."""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from kmq.errors import BrokerError, MessageTooLargeError
from kmq.proxy.app import create_app
from kmq.proxy.auth import QueuePatterns, TokenTable, parse_credentials
from kmq.proxy.backend import Delivery
from kmq.proxy.config import ProxyConfig
from kmq.proxy.handles import HandleCodec
from kmq.receipts import Receipt

with warnings.catch_warnings():  # starlette asks for httpx2; httpx works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

SECRET = b"unit-test-secret-0123456789"
TOKEN = "unit-test-token-0123456789"
LIMITED = "limited-token-0123456789"
KEY_ID, KEY_SECRET = "AKIDUNIT", "unit-test-sqs-secret-0123456789"


class FakeBackend:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.seen: set[str] = set()
        self.to_deliver: list[Delivery] = []
        self.fail_with: BaseException | None = None

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if self.fail_with is not None:
            raise self.fail_with

    def start(self) -> None:
        pass

    def stop_waiting(self) -> None:
        pass

    def close(self, timeout_s: float = 30.0) -> None:
        pass

    async def send(
        self, queue: str, items: Sequence[tuple[bytes, Mapping[str, bytes] | None]]
    ) -> list[str | BaseException]:
        self._record("send", queue, list(items))
        return [f"id{i}" for i in range(len(items))]

    async def receive(
        self,
        queue: str,
        max_messages: int,
        wait_s: float,
        lease_s: float,
        gone: asyncio.Event | None = None,
    ) -> list[Delivery]:
        self._record("receive", queue, max_messages, wait_s, lease_s)
        out, self.to_deliver = self.to_deliver[:max_messages], self.to_deliver[max_messages:]
        return out

    def release_soon(self, deliveries: Sequence[Delivery], reason: str) -> None:
        self._record("release_soon", list(deliveries))

    async def ack(self, receipts: Sequence[Receipt]) -> None:
        self._record("ack", list(receipts))

    async def nack(self, receipts: Sequence[Receipt], delay_s: float | None, reason: str) -> None:
        self._record("nack", list(receipts), delay_s, reason)

    async def extend(self, receipts: Sequence[Receipt], lease_s: float) -> None:
        self._record("extend", list(receipts), lease_s)

    async def release(self, receipts: Sequence[Receipt], reason: str = "released") -> None:
        self._record("release", list(receipts))

    async def reject(self, receipts: Sequence[Receipt], reason: str) -> None:
        self._record("reject", list(receipts), reason)

    def status(self) -> dict[str, dict[str, int]]:
        return {"emails": {"waiting": 1}, "limited-q": {"waiting": 0}}

    async def approximate_waiting(self, queue: str) -> int:
        self._record("approximate_waiting", queue)
        return 42


def config(**overrides: Any) -> ProxyConfig:
    settings: dict[str, Any] = {
        "secrets": (SECRET,),
        "tokens": TokenTable.parse(f"{TOKEN}\n{LIMITED} limited-*"),
        "sqs_keys": parse_credentials(f"{KEY_ID} {KEY_SECRET}"),
        "max_body_bytes": 4096,
        "handle_ttl_s": 60.0,
    }
    settings.update(overrides)
    return ProxyConfig(**settings)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


def client_for(backend: FakeBackend, token: str | None = TOKEN, **overrides: Any) -> TestClient:
    app = create_app(config(**overrides), backend)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(app, headers=headers, raise_server_exceptions=False)


@pytest.fixture
def client(backend: FakeBackend) -> Iterator[TestClient]:
    with client_for(backend) as c:
        yield c


RECEIPT = Receipt("emails", "m1", 0, 1, 10, 1, 0)


def handle(receipt: Receipt = RECEIPT, expires_ms: int | None = None) -> str:
    expires = expires_ms if expires_ms is not None else int(time.time() * 1000) + 60_000
    return HandleCodec([SECRET]).sign(receipt, expires)


# -- credentials ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "status", "code"),
    [
        (None, 401, "unauthenticated"),
        ("wrong-token-0123456789", 401, "invalid_token"),
        (LIMITED, 403, "forbidden"),
    ],
)
def test_refused_credentials_touch_nothing(
    backend: FakeBackend, token: str | None, status: int, code: str
) -> None:
    with client_for(backend, token) as c:
        for path, body in (
            ("messages", {"body": "YQ=="}),
            ("receive", {}),
            ("ack", {"receipts": [handle()]}),
            ("extend", {"receipts": [handle()], "visibility_s": 5}),
        ):
            r = c.post(f"/v1/queues/emails/{path}", json=body)
            assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert c.get("/v1/queues/emails/stats").status_code == status
    assert backend.calls == []


def test_a_limited_token_works_on_its_queues_and_sees_only_them(backend: FakeBackend) -> None:
    with client_for(backend, LIMITED) as c:
        assert c.post("/v1/queues/limited-q/messages", json={"body": "YQ=="}).status_code == 201
        assert c.get("/v1/status").json() == {"queues": {"limited-q": {"waiting": 0}}}
    assert backend.calls == [("send", ("limited-q", [(b"a", {})]))]


def test_an_allow_list_hides_other_queues(backend: FakeBackend) -> None:
    with client_for(backend, queues=QueuePatterns(("emails",))) as c:
        r = c.post("/v1/queues/other/receive", json={})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_queue"
        assert c.post("/v1/queues/emails/receive", json={}).status_code == 200


def test_without_tokens_the_native_api_refuses_everyone(backend: FakeBackend) -> None:
    with client_for(backend, tokens=None) as c:
        assert c.post("/v1/queues/emails/receive", json={}).status_code == 401
    with client_for(backend, None, tokens=None, insecure_no_auth=True) as c:
        assert c.post("/v1/queues/emails/receive", json={}).status_code == 200


def test_health_needs_no_credentials(backend: FakeBackend) -> None:
    with client_for(backend, None) as c:
        assert c.get("/v1/health").json() == {"status": "ok"}


# -- bad requests -------------------------------------------------------------------------------


def test_a_validation_error_does_not_echo_the_input(
    client: TestClient, backend: FakeBackend
) -> None:
    r = client.post("/v1/queues/emails/messages", json={"body": "c2VjcmV0", "headers": {"h": "!!"}})
    assert r.status_code == 400 and "headers.h" in r.json()["error"]["message"]
    assert "!!" not in r.text and "c2VjcmV0" not in r.text
    assert backend.calls == []


@pytest.mark.parametrize("size", [4097, 100_000])
def test_a_body_over_the_limit_is_413(client: TestClient, backend: FakeBackend, size: int) -> None:
    r = client.post(
        "/v1/queues/emails/messages",
        content=b"x" * size,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
        for _ in range(size // 1000 + 1):
            yield b"x" * 1000

    r = client.post("/v1/queues/emails/messages", content=chunks())
    assert r.status_code == 413
    assert backend.calls == []


def test_kmq_errors_map_to_statuses_and_unknown_ones_to_a_bare_500(backend: FakeBackend) -> None:
    with client_for(backend) as c:
        for exc, status, code in (
            (BrokerError("down"), 503, "unavailable"),
            (MessageTooLargeError("big"), 413, "message_too_large"),
            (RuntimeError("secret detail"), 500, "internal"),
        ):
            backend.fail_with = exc
            for method, path, body in (
                ("post", "/v1/queues/emails/ack", {"receipts": [handle()]}),
                ("post", "/v1/queues/emails/receive", {"wait_s": 1}),
                ("get", "/v1/queues/emails/stats", None),
            ):
                r = c.request(method, path, json=body)
                assert r.status_code == status and r.json()["error"]["code"] == code, r.text
                assert "secret detail" not in r.text and "Traceback" not in r.text


# -- receive and receipt handles ------------------------------------------------------------------


def test_received_messages_carry_handles_any_replica_opens(
    client: TestClient, backend: FakeBackend
) -> None:
    backend.to_deliver = [Delivery(RECEIPT, b"\x00\xff", {"h": b"\x01"}, 5)]
    r = client.post("/v1/queues/emails/receive", json={"max_messages": 10, "wait_s": 0})
    (m,) = r.json()["messages"]
    assert (m["id"], m["attempt"], m["body"], m["headers"]) == ("m1", 1, "AP8=", {"h": "AQ=="})
    assert m["visibility_s"] == 30.0
    assert backend.calls == [("receive", ("emails", 10, 0.0, 30.0))]
    opened = HandleCodec([SECRET]).open(m["receipt"], int(time.time() * 1000))
    assert opened.receipt == RECEIPT and opened.expires_ms == m["receipt_expires_at_ms"]


def test_expired_tampered_and_foreign_handles_write_nothing(
    client: TestClient, backend: FakeBackend
) -> None:
    good = handle()
    expired = handle(expires_ms=int(time.time() * 1000) - 1)
    tampered = good[:-3] + ("A" if good[-3] != "A" else "B") + good[-2:]
    foreign = handle(Receipt("other", "m1", 0, 1, 10, 1, 0))
    forged = HandleCodec([b"another-secret-0123456789"]).sign(RECEIPT, 2**60)
    for bad, code in (
        (expired, "receipt_expired"),
        (tampered, "invalid_receipt"),
        (foreign, "invalid_receipt"),
        (forged, "invalid_receipt"),
    ):
        for verb, extra in (
            ("ack", {}),
            ("nack", {}),
            ("extend", {"visibility_s": 5}),
            ("release", {}),
            ("reject", {}),
        ):
            r = client.post(f"/v1/queues/emails/{verb}", json={"receipts": [good, bad], **extra})
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (verb, r.text)
    assert backend.calls == []
    r = client.post("/v1/queues/emails/ack", json={"receipts": [good, good]})
    assert r.json() == {"settled": 2}
    assert backend.calls == [("ack", ([RECEIPT, RECEIPT],))]


def test_a_lease_cannot_outlive_its_handle(client: TestClient, backend: FakeBackend) -> None:
    r = client.post("/v1/queues/emails/extend", json={"receipts": [handle()], "visibility_s": 61})
    assert r.status_code == 400 and r.json()["error"]["code"] == "lease_too_long"
    r = client.post("/v1/queues/emails/receive", json={"visibility_s": 61})
    assert r.status_code == 400
    assert backend.calls == []
    r = client.post(
        "/v1/queues/emails/nack", json={"receipts": [handle()], "delay_s": 1.5, "reason": "r"}
    )
    assert r.status_code == 200 and backend.calls == [("nack", ([RECEIPT], 1.5, "r"))]


# -- the SQS endpoint ---------------------------------------------------------------------------


def sqs_post(
    c: TestClient,
    action: str,
    body: dict[str, Any] | bytes,
    *,
    secret: str = KEY_SECRET,
    content_type: str = "application/x-amz-json-1.0",
    sign: bool = True,
) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = AWSRequest(
        method="POST",
        url="http://testserver/",
        data=data,
        headers={"Content-Type": content_type, "X-Amz-Target": f"AmazonSQS.{action}"},
    )
    if sign:
        SigV4Auth(Credentials(KEY_ID, secret), "sqs", "us-east-1").add_auth(request)
    headers = {k: v for k, v in request.prepare().headers.items() if k != "Content-Length"}
    return c.post("/", content=data, headers=headers)


def test_sqs_requests_are_verified_before_anything_is_read(backend: FakeBackend) -> None:
    with client_for(backend, None) as c:
        url = "http://testserver/000000000000/emails"
        for kwargs, code in (
            ({"sign": False}, "MissingAuthenticationToken"),
            ({"secret": "wrong-secret-0123456789abc"}, "SignatureDoesNotMatch"),
        ):
            r = sqs_post(c, "SendMessage", {"QueueUrl": url, "MessageBody": "x"}, **kwargs)
            assert r.status_code == 403 and r.json()["__type"].endswith(code), r.text
            assert r.headers["x-amzn-query-error"].startswith(code)
        assert backend.calls == []
        r = sqs_post(c, "SendMessage", {"QueueUrl": url, "MessageBody": "x"})
        assert r.status_code == 200 and r.json()["MessageId"] == "id0"
        r = sqs_post(
            c, "SendMessage", {"QueueUrl": url, "MessageBody": "x"}, content_type="text/plain"
        )
        assert r.status_code == 400 and r.json()["__type"].endswith("InvalidAction")


def test_sqs_bad_bodies_and_actions_get_sqs_errors_not_500s(backend: FakeBackend) -> None:
    with client_for(backend, None) as c:
        for action, body, status, code in (
            ("SendMessage", b'{"QueueUrl": ', 400, "SerializationException"),
            ("SendMessage", b"[1, 2]", 400, "SerializationException"),
            ("SendMessage", b"\xff\xfe", 400, "SerializationException"),
            ("Frobnicate", b"{}", 400, "InvalidAction"),
            ("PurgeQueue", b"{}", 400, "UnsupportedOperation"),
            ("SendMessage", b'{"QueueUrl": 5, "MessageBody": "x"}', 400, "InvalidParameterValue"),
            ("SendMessage", b'{"MessageBody": "x"}', 400, "MissingParameter"),
            ("SendMessage", b"x" * 5000, 413, "RequestEntityTooLarge"),
        ):
            r = sqs_post(c, action, body)
            assert r.status_code == status, (action, body, r.text)
            assert r.json()["__type"] == f"com.amazonaws.sqs#{code}", r.text
            assert r.headers["content-type"] == "application/x-amz-json-1.0"
        assert backend.calls == []


def test_sqs_handles_and_visibility(backend: FakeBackend) -> None:
    with client_for(backend, None) as c:
        url = "http://testserver/000000000000/emails"
        r = sqs_post(c, "DeleteMessage", {"QueueUrl": url, "ReceiptHandle": "forged"})
        assert r.status_code == 400 and r.json()["__type"].endswith("ReceiptHandleIsInvalid")
        expired = handle(expires_ms=1)
        r = sqs_post(c, "DeleteMessage", {"QueueUrl": url, "ReceiptHandle": expired})
        assert r.status_code == 400 and "expired" in r.json()["message"]
        r = sqs_post(
            c,
            "ChangeMessageVisibility",
            {"QueueUrl": url, "ReceiptHandle": handle(), "VisibilityTimeout": 61},
        )
        assert r.status_code == 400 and r.json()["__type"].endswith("InvalidParameterValue")
        assert backend.calls == []
        for timeout, call in ((0, "release"), (30, "extend")):
            r = sqs_post(
                c,
                "ChangeMessageVisibility",
                {"QueueUrl": url, "ReceiptHandle": handle(), "VisibilityTimeout": timeout},
            )
            assert r.status_code == 200 and backend.calls[-1][0] == call
        r = sqs_post(
            c,
            "DeleteMessageBatch",
            {
                "QueueUrl": url,
                "Entries": [
                    {"Id": "a", "ReceiptHandle": handle()},
                    {"Id": "b", "ReceiptHandle": "junk"},
                ],
            },
        )
        assert [e["Id"] for e in r.json()["Successful"]] == ["a"]
        assert [e["Code"] for e in r.json()["Failed"]] == ["ReceiptHandleIsInvalid"]
        assert backend.calls[-1] == ("ack", ([RECEIPT],))


def test_sqs_queue_attributes_report_the_lag_based_depth(backend: FakeBackend) -> None:
    with client_for(backend, None) as c:
        url = "http://testserver/000000000000/emails"
        r = sqs_post(c, "GetQueueAttributes", {"QueueUrl": url, "AttributeNames": ["All"]})
        attrs = r.json()["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "42" and attrs["VisibilityTimeout"] == "30"
        assert attrs["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:emails"
