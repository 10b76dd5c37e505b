"""The SQS-compatible endpoint: ``POST /`` in the AWS JSON 1.0 protocol, SigV4-signed.
Parsing and checks are in :mod:`kmq.proxy.sqs`; this module authenticates, dispatches and
talks to the backend."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kmq.errors import (
    BrokerError,
    InvalidMessageError,
    InvalidQueueError,
    KmqError,
    MessageTooLargeError,
)
from kmq.proxy import sqs
from kmq.proxy.auth import AccessKey, AuthError, SignedRequest, verify_sigv4
from kmq.proxy.backend import Delivery
from kmq.proxy.context import Proxy, proxy, watch_disconnect
from kmq.proxy.handles import HandleError
from kmq.proxy.leased import LeasedResponse
from kmq.proxy.sqs import SqsError
from kmq.receipts import Receipt

log = logging.getLogger("kmq.proxy")

_OPEN = AccessKey("*")
Body = dict[str, Any]


def _error(exc: SqsError) -> Response:
    status, headers, body = exc.render()
    return Response(body, status_code=status, headers=headers)


def _from_kmq(exc: KmqError) -> SqsError:
    if isinstance(exc, MessageTooLargeError):
        return sqs.invalid(f"Message too long: {exc}")
    if isinstance(exc, InvalidQueueError):
        return SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    if isinstance(exc, InvalidMessageError):
        return sqs.invalid(str(exc))
    if isinstance(exc, BrokerError):
        return SqsError("ServiceUnavailable", f"Kafka is unavailable: {exc}", 503, sender=False)
    return SqsError("InternalError", "internal error", 500, sender=False)


async def handle(request: Request) -> Response:
    """Every SQS action. Credentials are checked before anything else is looked at."""
    ctx = proxy(request)
    try:
        raw = await request.body()
        key = _authenticate(ctx, request, raw)
        if not request.headers.get("content-type", "").startswith(sqs.CONTENT_TYPE):
            raise SqsError(
                "InvalidAction",
                f"kmq serve speaks the AWS JSON 1.0 protocol (Content-Type {sqs.CONTENT_TYPE})",
            )
        action = sqs.parse_action(request.headers.get("x-amz-target"))
        body = sqs.parse_body(raw)
        call = _Call(ctx, request, key, body)
        result = await _ACTIONS[action](call)
    except SqsError as exc:
        return _error(exc)
    except AuthError as exc:
        return _error(SqsError(exc.code, exc.message, exc.status))
    except KmqError as exc:
        return _error(_from_kmq(exc))
    except Exception:
        log.exception("SQS request failed")
        return _error(SqsError("InternalError", "internal error", 500, sender=False))
    leased = call.leased
    if leased:
        return LeasedResponse(
            result,
            lambda: ctx.backend.release_soon(leased, "client gone before its answer was written"),
            media_type=sqs.CONTENT_TYPE,
        )
    return Response(json.dumps(result), media_type=sqs.CONTENT_TYPE)


def _authenticate(ctx: Proxy, request: Request, body: bytes) -> AccessKey:
    if ctx.config.insecure_no_auth:
        return _OPEN
    keys = ctx.config.sqs_keys
    if not keys:
        raise AuthError(403, "InvalidClientTokenId", "the SQS API has no access keys configured")
    signed = SignedRequest(
        method=request.method,
        path=request.url.path,
        query=request.url.query,
        headers=tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw),
        body=body,
    )
    return verify_sigv4(signed, keys, max_skew_s=ctx.config.max_clock_skew_s)


class _Call:
    __slots__ = ("body", "ctx", "key", "leased", "request")

    def __init__(self, ctx: Proxy, request: Request, key: AccessKey, body: Body) -> None:
        self.ctx = ctx
        self.request = request
        self.key = key
        self.body = body
        self.leased: list[Delivery] = []
        """Messages the answer hands out: released if it cannot be written."""

    @property
    def base_url(self) -> str:
        if self.ctx.config.public_url:
            return self.ctx.config.public_url
        host = self.request.headers.get("host") or f"{self.request.url.hostname}"
        return f"{self.request.url.scheme}://{host}"

    def url(self, queue: str) -> str:
        return sqs.queue_url(self.base_url, self.ctx.config.account_id, queue)

    def check(self, queue: str) -> str:
        if not self.ctx.config.queues.allows(queue):
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        if not self.key.queues.allows(queue):
            raise SqsError("AccessDenied", f"Access to queue {queue} is denied.", 403)
        return queue

    def queue(self) -> str:
        return self.check(sqs.queue_from_url(sqs.string(self.body, "QueueUrl")))

    def receipt(self, queue: str, handle: object, now_ms: int) -> tuple[Receipt, int]:
        try:
            opened = self.ctx.open(handle, now_ms)
        except HandleError as exc:
            if exc.reason == "expired":
                raise sqs.invalid("Value for parameter ReceiptHandle is invalid. Reason: "
                                  "The receipt handle has expired.") from None  # fmt: skip
            raise SqsError(
                "ReceiptHandleIsInvalid", f"The input receipt handle is invalid: {exc}"
            ) from None
        if opened.receipt.queue != queue:
            raise SqsError("ReceiptHandleIsInvalid", "The receipt handle is not one of this queue.")
        return opened.receipt, opened.expires_ms


def _effective(ctx: Proxy) -> dict[str, str]:
    return {
        "VisibilityTimeout": str(round(ctx.config.default_visibility_s)),
        "DelaySeconds": "0",
        "ReceiveMessageWaitTimeSeconds": "0",
    }


async def _create_queue(call: _Call) -> Body:
    queue = call.check(sqs.queue_name(sqs.string(call.body, "QueueName")))
    sqs.check_create_attributes(call.body.get("Attributes"), _effective(call.ctx))
    call.ctx.backend.seen.add(queue)
    return {"QueueUrl": call.url(queue)}


async def _get_queue_url(call: _Call) -> Body:
    try:
        name = sqs.queue_name(sqs.string(call.body, "QueueName"))
    except SqsError as exc:
        if exc.code != "InvalidParameterValue":
            raise
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None
    queue = call.check(name)
    return {"QueueUrl": call.url(queue)}


async def _list_queues(call: _Call) -> Body:
    prefix = sqs.string(call.body, "QueueNamePrefix", required=False) or ""
    limit = sqs.integer(call.body, "MaxResults", 1, 1000, None)
    token = sqs.string(call.body, "NextToken", required=False)
    named = {p for p in call.ctx.config.queues.patterns if not p.endswith("*")}
    names = sorted(
        q
        for q in named | call.ctx.backend.seen
        if q.startswith(prefix) and call.ctx.config.queues.allows(q) and call.key.queues.allows(q)
    )
    start = 0
    if token:
        if not token.isdigit():
            raise sqs.invalid("Invalid NextToken.")
        start = int(token)
    end = len(names) if limit is None else start + limit
    out: Body = {"QueueUrls": [call.url(q) for q in names[start:end]]}
    if end < len(names):
        out["NextToken"] = str(end)
    return out


def _sent(entry: sqs.SendEntry, message_id: str) -> Body:
    out: Body = {"MessageId": message_id, "MD5OfMessageBody": entry.md5_body}
    if entry.md5_attributes:
        out["MD5OfMessageAttributes"] = entry.md5_attributes
    return out


async def _send_message(call: _Call) -> Body:
    queue = call.queue()
    entry = sqs.parse_send(call.body)
    (result,) = await call.ctx.backend.send(queue, [(entry.payload, entry.headers)])
    if isinstance(result, KmqError):
        raise _from_kmq(result)
    if isinstance(result, BaseException):
        raise result
    return _sent(entry, result)


async def _send_message_batch(call: _Call) -> Body:
    queue = call.queue()
    successful: list[Body] = []
    failed: list[Body] = []
    good: list[sqs.SendEntry] = []
    for raw in sqs.batch_entries(call.body):
        try:
            good.append(sqs.parse_send(raw, raw["Id"]))
        except SqsError as exc:
            failed.append(sqs.failed_entry(raw["Id"], exc))
    results = (
        await call.ctx.backend.send(queue, [(e.payload, e.headers) for e in good]) if good else []
    )
    for entry, result in zip(good, results, strict=True):
        assert entry.entry_id is not None
        if isinstance(result, str):
            successful.append({"Id": entry.entry_id, **_sent(entry, result)})
        else:
            error = (
                _from_kmq(result)
                if isinstance(result, KmqError)
                else SqsError("InternalError", "internal error", 500, sender=False)
            )
            failed.append(sqs.failed_entry(entry.entry_id, error))
    return {"Successful": successful, "Failed": failed}


async def _receive_message(call: _Call) -> Body:
    queue = call.queue()
    ctx = call.ctx
    params = sqs.parse_receive(call.body, round(ctx.config.default_visibility_s))
    ttl_s = ctx.config.handle_ttl_s
    if params.visibility_s > ttl_s:
        raise sqs.invalid(f"VisibilityTimeout must be <= {ttl_s:g} here.")
    # VisibilityTimeout 0: visible again at once (the shortest lease kmq has).
    lease_s = params.visibility_s or 0.001
    gone = asyncio.Event()
    watcher = asyncio.ensure_future(watch_disconnect(call.request, gone)) if params.wait_s else None
    try:
        deliveries = await ctx.backend.receive(
            queue, params.max_messages, params.wait_s, lease_s, gone
        )
    finally:
        if watcher is not None:
            watcher.cancel()
    if gone.is_set():
        ctx.backend.release_soon(deliveries, "client gone during its long poll")
        return {}
    handles, _ = ctx.handles(deliveries)
    messages = [
        sqs.render_message(
            message_id=d.message_id,
            handle=h,
            payload=d.payload,
            headers=d.headers,
            attempt=d.attempt,
            sent_ms=d.timestamp_ms,
            params=params,
        )
        for d, h in zip(deliveries, handles, strict=True)
    ]
    call.leased = deliveries
    return {"Messages": messages} if messages else {}


async def _delete_message(call: _Call) -> Body:
    queue = call.queue()
    handle = sqs.string(call.body, "ReceiptHandle")
    receipt, _ = call.receipt(queue, handle, int(time.time() * 1000))
    await call.ctx.backend.ack([receipt])
    return {}


async def _delete_message_batch(call: _Call) -> Body:
    queue = call.queue()
    now_ms = int(time.time() * 1000)
    failed: list[Body] = []
    good: list[tuple[str, Receipt]] = []
    for raw in sqs.batch_entries(call.body):
        try:
            handle = sqs.string(raw, "ReceiptHandle")
            good.append((raw["Id"], call.receipt(queue, handle, now_ms)[0]))
        except SqsError as exc:
            failed.append(sqs.failed_entry(raw["Id"], exc))
    if good:
        try:
            await call.ctx.backend.ack([r for _, r in good])
        except KmqError as exc:
            error = _from_kmq(exc)
            return {
                "Successful": [],
                "Failed": failed + [sqs.failed_entry(i, error) for i, _ in good],
            }
    return {"Successful": [{"Id": i} for i, _ in good], "Failed": failed}


async def _change(call: _Call, queue: str, entry: Body, now_ms: int) -> None:
    handle = sqs.string(entry, "ReceiptHandle")
    timeout = sqs.integer(entry, "VisibilityTimeout", 0, sqs.MAX_VISIBILITY_S, None)
    if timeout is None:
        raise sqs.missing("VisibilityTimeout")
    receipt, expires_ms = call.receipt(queue, handle, now_ms)
    if timeout == 0:
        await call.ctx.backend.release([receipt], "visibility timeout set to 0")
        return
    if now_ms + timeout * 1000 > expires_ms:
        raise sqs.invalid(
            f"Value {timeout} for parameter VisibilityTimeout is invalid. Reason: the total "
            f"visibility timeout cannot exceed {call.ctx.config.handle_ttl_s:g} s from the receive."
        )
    await call.ctx.backend.extend([receipt], float(timeout))


async def _change_message_visibility(call: _Call) -> Body:
    queue = call.queue()
    await _change(call, queue, call.body, int(time.time() * 1000))
    return {}


async def _change_message_visibility_batch(call: _Call) -> Body:
    queue = call.queue()
    now_ms = int(time.time() * 1000)
    entries = sqs.batch_entries(call.body)

    async def one(entry: Body) -> SqsError | None:
        try:
            await _change(call, queue, entry, now_ms)
        except SqsError as exc:
            return exc
        except KmqError as exc:
            return _from_kmq(exc)
        return None

    results = await asyncio.gather(*(one(e) for e in entries))
    return {
        "Successful": [{"Id": e["Id"]} for e, r in zip(entries, results, strict=True) if r is None],
        "Failed": [
            sqs.failed_entry(e["Id"], r) for e, r in zip(entries, results, strict=True) if r
        ],
    }


async def _get_queue_attributes(call: _Call) -> Body:
    queue = call.queue()
    ctx = call.ctx
    wanted = sqs.wanted_queue_attributes(sqs.string_list(call.body, "AttributeNames"))
    values = {
        **_effective(ctx),
        "MaximumMessageSize": str(min(ctx.config.max_body_bytes, ctx.max_message_bytes)),
        "QueueArn": f"arn:aws:sqs:{ctx.config.region}:{ctx.config.account_id}:{queue}",
    }
    if "ApproximateNumberOfMessages" in wanted:
        values["ApproximateNumberOfMessages"] = str(await ctx.backend.approximate_waiting(queue))
    return {"Attributes": {name: values[name] for name in wanted}}


_ACTIONS: dict[str, Callable[[_Call], Awaitable[Body]]] = {
    "CreateQueue": _create_queue,
    "GetQueueUrl": _get_queue_url,
    "ListQueues": _list_queues,
    "SendMessage": _send_message,
    "SendMessageBatch": _send_message_batch,
    "ReceiveMessage": _receive_message,
    "DeleteMessage": _delete_message,
    "DeleteMessageBatch": _delete_message_batch,
    "ChangeMessageVisibility": _change_message_visibility,
    "ChangeMessageVisibilityBatch": _change_message_visibility_batch,
    "GetQueueAttributes": _get_queue_attributes,
}
assert set(_ACTIONS) == sqs.SUPPORTED
