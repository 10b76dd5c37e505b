"""The native JSON API, ``/v1``: send, receive (long polling), ack, nack, extend, release,
reject. Every route but ``/v1/health`` needs a bearer token allowed for the queue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kmq.errors import InvalidQueueError, KmqError
from kmq.proxy import models as m
from kmq.proxy.auth import AuthError, QueuePatterns
from kmq.proxy.context import Proxy, proxy, watch_disconnect
from kmq.proxy.errors import ApiError, from_kmq
from kmq.proxy.handles import HandleError
from kmq.proxy.leased import LeasedResponse
from kmq.receipts import Receipt
from kmq.validation import check_queue_id

router = APIRouter(prefix="/v1")
_bearer = HTTPBearer(
    auto_error=False, description="A token from --tokens-file or KMQ_PROXY_TOKENS."
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": m.ErrorOut, "description": text}
    for status, text in (
        (400, "Bad request: malformed JSON, bad parameters, invalid or expired receipt"),
        (401, "No token, or an unknown one"),
        (403, "The token may not use this queue"),
        (404, "Not a queue this proxy serves"),
        (413, "Request body or message too large"),
        (503, "Kafka unavailable: try again"),
    )
}


Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]


def _patterns(ctx: Proxy, credentials: HTTPAuthorizationCredentials | None) -> QueuePatterns:
    if ctx.config.insecure_no_auth:
        return QueuePatterns()
    if ctx.config.tokens is None:
        raise ApiError(401, "unauthenticated", "the native API has no tokens configured",
                       {"WWW-Authenticate": "Bearer"})  # fmt: skip
    header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
    try:
        return ctx.config.tokens.authenticate(header)
    except AuthError as exc:
        raise ApiError(exc.status, exc.code, exc.message, {"WWW-Authenticate": "Bearer"}) from None


def queue_access(
    queue: str,
    request: Request,
    credentials: Bearer,
) -> str:
    """The path's queue, once the token may use it (401, then 400, 404, 403)."""
    ctx = proxy(request)
    allowed = _patterns(ctx, credentials)
    try:
        check_queue_id(queue)
    except InvalidQueueError as exc:
        raise ApiError(400, "invalid_queue", str(exc)) from None
    if not ctx.config.queues.allows(queue):
        raise ApiError(404, "unknown_queue", f"this proxy does not serve queue {queue!r}")
    if not allowed.allows(queue):
        raise ApiError(403, "forbidden", f"this token may not use queue {queue!r}")
    return queue


Queue = Annotated[str, Depends(queue_access)]


def _receipts(
    ctx: Proxy, queue: str, handles: Sequence[str], lease_s: float | None = None
) -> list[Receipt]:
    """Every handle opened, or a 400 before anything is written."""
    now_ms = int(time.time() * 1000)
    out: list[Receipt] = []
    for i, handle in enumerate(handles):
        try:
            opened = ctx.open(handle, now_ms)
        except HandleError as exc:
            code = "receipt_expired" if exc.reason == "expired" else "invalid_receipt"
            raise ApiError(400, code, f"receipts[{i}]: {exc}") from None
        if opened.receipt.queue != queue:
            raise ApiError(400, "invalid_receipt", f"receipts[{i}] is not one of queue {queue!r}")
        if lease_s is not None and now_ms + lease_s * 1000 > opened.expires_ms:
            raise ApiError(
                400,
                "lease_too_long",
                f"receipts[{i}]: the lease would outlive the receipt (valid "
                f"{ctx.config.handle_ttl_s:g} s from its receive)",
            )
        out.append(opened.receipt)
    return out


@router.get("/health", summary="Liveness: no Kafka call, no credentials")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/status", summary="Per queue: waiting long polls and buffered messages",
            responses=_ERRORS)  # fmt: skip
async def status(request: Request, credentials: Bearer) -> dict[str, Any]:
    ctx = proxy(request)
    allowed = _patterns(ctx, credentials)
    queues = {q: s for q, s in ctx.backend.status().items() if allowed.allows(q)}
    return {"queues": queues}


@router.post("/queues/{queue:path}/messages", status_code=201, response_model=m.SentOut,
             responses=_ERRORS, summary="Send one message")  # fmt: skip
async def send(message: m.MessageIn, request: Request, queue: Queue) -> JSONResponse:
    (result,) = await proxy(request).backend.send(queue, [(message.body, message.headers)])
    if isinstance(result, KmqError):
        raise from_kmq(result)
    if isinstance(result, BaseException):
        raise result
    return JSONResponse({"id": result}, status_code=201)


@router.post("/queues/{queue:path}/messages/batch", response_model=m.SentBatchOut,
             responses=_ERRORS, summary="Send up to 100 messages")  # fmt: skip
async def send_batch(batch: m.SendBatchIn, request: Request, queue: Queue) -> JSONResponse:
    results = await proxy(request).backend.send(
        queue, [(msg.body, msg.headers) for msg in batch.messages]
    )
    ids: list[str | None] = []
    failed: list[dict[str, Any]] = []
    for i, r in enumerate(results):
        if isinstance(r, str):
            ids.append(r)
            continue
        ids.append(None)
        error = (
            from_kmq(r) if isinstance(r, KmqError) else ApiError(500, "internal", "internal error")
        )
        failed.append({"index": i, "code": error.code, "message": error.message})
    if failed and len(failed) == len(results):
        first = results[0]
        raise (
            from_kmq(first)
            if isinstance(first, KmqError)
            else ApiError(500, "internal", "internal error")
        )
    return JSONResponse({"ids": ids, "failed": failed}, status_code=201 if not failed else 200)


@router.post("/queues/{queue:path}/receive", response_model=m.ReceiveOut, responses=_ERRORS,
             summary="Receive up to max_messages, long polling up to wait_s")  # fmt: skip
async def receive(params: m.ReceiveIn, request: Request, queue: Queue) -> JSONResponse:
    ctx = proxy(request)
    visibility_s = params.visibility_s or ctx.config.default_visibility_s
    if visibility_s > ctx.config.handle_ttl_s:
        limit = ctx.config.handle_ttl_s
        raise ApiError(
            400, "invalid_request", f"visibility_s must be <= {limit:g} (receipt lifetime)"
        )
    gone = asyncio.Event()
    watcher = asyncio.ensure_future(watch_disconnect(request, gone)) if params.wait_s else None
    try:
        deliveries = await ctx.backend.receive(
            queue, params.max_messages, params.wait_s, visibility_s, gone
        )
    finally:
        if watcher is not None:
            watcher.cancel()
    if gone.is_set():
        ctx.backend.release_soon(deliveries, "client gone during its long poll")
        return JSONResponse({"messages": []})
    handles, expires_ms = ctx.handles(deliveries)
    messages = [
        {
            "id": d.message_id,
            "queue": queue,
            "attempt": d.attempt,
            "body": m.encode_base64(d.payload),
            "headers": {k: m.encode_base64(v) for k, v in d.headers.items()},
            "sent_at_ms": d.timestamp_ms,
            "receipt": handle,
            "visibility_s": visibility_s,
            "receipt_expires_at_ms": expires_ms,
        }
        for d, handle in zip(deliveries, handles, strict=True)
    ]
    if not messages:
        return JSONResponse({"messages": []})
    return LeasedResponse(
        {"messages": messages},
        lambda: ctx.backend.release_soon(deliveries, "client gone before its answer was written"),
    )


@router.post("/queues/{queue:path}/ack", response_model=m.SettledOut, responses=_ERRORS,
             summary="Done: never redelivered")  # fmt: skip
async def ack(body: m.ReceiptsIn, request: Request, queue: Queue) -> dict[str, int]:
    ctx = proxy(request)
    receipts = _receipts(ctx, queue, body.receipts)
    await _settle(ctx.backend.ack(receipts))
    return {"settled": len(receipts)}


@router.post("/queues/{queue:path}/nack", response_model=m.SettledOut, responses=_ERRORS,
             summary="Give back: redelivered after delay_s with attempt + 1")  # fmt: skip
async def nack(body: m.NackIn, request: Request, queue: Queue) -> dict[str, int]:
    ctx = proxy(request)
    receipts = _receipts(ctx, queue, body.receipts)
    await _settle(ctx.backend.nack(receipts, body.delay_s, body.reason))
    return {"settled": len(receipts)}


@router.post("/queues/{queue:path}/extend", response_model=m.SettledOut, responses=_ERRORS,
             summary="Keep leased for visibility_s more seconds, from now")  # fmt: skip
async def extend(body: m.ExtendIn, request: Request, queue: Queue) -> dict[str, int]:
    ctx = proxy(request)
    receipts = _receipts(ctx, queue, body.receipts, body.visibility_s)
    await _settle(ctx.backend.extend(receipts, body.visibility_s))
    return {"settled": len(receipts)}


@router.post("/queues/{queue:path}/release", response_model=m.SettledOut, responses=_ERRORS,
             summary="Give back unprocessed: redelivered now, attempt unchanged")  # fmt: skip
async def release(body: m.ReceiptsIn, request: Request, queue: Queue) -> dict[str, int]:
    ctx = proxy(request)
    receipts = _receipts(ctx, queue, body.receipts)
    await _settle(ctx.backend.release(receipts))
    return {"settled": len(receipts)}


@router.post("/queues/{queue:path}/reject", response_model=m.SettledOut, responses=_ERRORS,
             summary="Dead-letter now")  # fmt: skip
async def reject(body: m.RejectIn, request: Request, queue: Queue) -> dict[str, int]:
    ctx = proxy(request)
    receipts = _receipts(ctx, queue, body.receipts)
    await _settle(ctx.backend.reject(receipts, body.reason))
    return {"settled": len(receipts)}


@router.get("/queues/{queue:path}/stats", response_model=m.QueueOut, responses=_ERRORS,
            summary="Approximate depth")  # fmt: skip
async def queue_info(request: Request, queue: Queue) -> dict[str, Any]:
    count = await _settle(proxy(request).backend.approximate_waiting(queue))
    return {"queue": queue, "approximate_waiting": count}


async def _settle(call: Any) -> Any:
    try:
        return await call
    except KmqError as exc:
        raise from_kmq(exc) from None
