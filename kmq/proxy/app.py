"""The ASGI application: the native API, the SQS endpoint, a request-body limit, and error
handlers that turn every failure into a JSON answer (never a traceback)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import kmq
from kmq.errors import KmqError
from kmq.proxy import native, sqs_api
from kmq.proxy.backend import KafkaSide
from kmq.proxy.config import ProxyConfig
from kmq.proxy.context import Proxy
from kmq.proxy.errors import ApiError, from_kmq, http_status_code
from kmq.proxy.handles import HandleCodec
from kmq.proxy.sqs import SqsError

log = logging.getLogger("kmq.proxy")

DESCRIPTION = """kmq queues over HTTP. Payloads and header values are base64. A receive hands
each message to you for `visibility_s`: ack, nack, extend, release or reject it by its
`receipt` through any replica; if you do none of these in time, it is redelivered.
The SQS-compatible API (AWS JSON 1.0, SigV4) is `POST /` and is not described here."""


def create_app(
    config: ProxyConfig, backend: KafkaSide, *, max_message_bytes: int = 1_000_000
) -> FastAPI:
    """The app of one replica. ``backend.start()`` runs at startup, ``backend.close()``
    at shutdown (both on a worker thread)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(backend.start)
        try:
            yield
        finally:
            await asyncio.to_thread(backend.close)

    app = FastAPI(
        title="kmq serve",
        version=kmq.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        redoc_url=None,
    )
    app.state.proxy = Proxy(config, backend, HandleCodec(config.secrets), max_message_bytes)
    app.include_router(native.router)
    app.add_api_route("/", sqs_api.handle, methods=["POST"], include_in_schema=False)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(KmqError, _kmq_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    return app


def _json_error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _json_error(exc)


async def _kmq_error(_: Request, exc: Exception) -> Response:
    """kmq errors a handler let through (a receive's broker trouble, say): 4xx/503, not 500."""
    assert isinstance(exc, KmqError)
    error = from_kmq(exc)
    if error.status == 500:
        log.error("request failed", exc_info=exc)
    return _json_error(error)


def _where(loc: Any) -> str:
    parts = [str(p) for p in loc if p != "body"] if isinstance(loc, (list, tuple)) else []
    return ".".join(parts) or "body"


def validation_message(errors: Any) -> str:
    """One line per problem, without echoing the input back."""
    lines = []
    for e in list(errors)[:10]:
        if e.get("type") == "json_invalid":
            return "the request body is not valid JSON"
        lines.append(f"{_where(e.get('loc'))}: {e.get('msg', 'invalid')}")
    return "; ".join(lines) or "invalid request"


async def _validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return _json_error(ApiError(400, "invalid_request", validation_message(exc.errors())))


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail if isinstance(exc.detail, str) else "request refused"
    return _json_error(ApiError(exc.status_code, http_status_code(exc.status_code), message,
                                dict(exc.headers or {})))  # fmt: skip


async def _internal_error(_: Request, exc: Exception) -> Response:
    log.error("request failed", exc_info=exc)
    return _json_error(ApiError(500, "internal", "internal error"))


class BodyLimit:
    """Reads the whole request body first, refusing one over ``max_bytes`` with a 413
    (an SQS-shaped error on the SQS endpoint). The app then gets the body from memory, and
    later reads (a long poll watching for the client to hang up) go to the server."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_bytes):
                await self._refuse(scope, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        text = f"the request body is over {self.max_bytes} bytes"
        if scope.get("path") == "/" and any(k == b"x-amz-target" for k, _ in scope["headers"]):
            status, headers, body = SqsError("RequestEntityTooLarge", text, 413).render()
            response: Response = Response(body, status_code=status, headers=headers)
        else:
            response = _json_error(ApiError(413, "body_too_large", text, {"Connection": "close"}))
        await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
