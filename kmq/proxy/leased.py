"""Writing a receive's answer: if the client is found gone before its body is written, the
messages in it are released at once instead of waiting out their leases.

uvicorn drops what is sent on a connection it knows is closed, without a word, so the
answer asks before each write: the start, each chunk of the body, and the end. Bytes the
server has taken can still be lost with the connection; their leases cover that."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

CHUNK_BYTES = 64 * 1024
"""The body goes out in pieces this size, with a check that the client is there after each."""


class LeasedResponse(JSONResponse):
    """A JSON answer that carries leased messages; ``release`` runs (once) instead of
    completing it if the client has gone."""

    def __init__(
        self, content: Any, release: Callable[[], None], media_type: str | None = None
    ) -> None:
        super().__init__(content, media_type=media_type)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            written = await self._write(scope, receive, send)
        except OSError:  # a server that raises on writing to a closed connection
            written = False
        if not written:
            self._release()

    async def _write(self, scope: Scope, receive: Receive, send: Send) -> bool:
        request = Request(scope, receive)
        if await request.is_disconnected():
            return False
        start = {"type": "http.response.start", "status": self.status_code,
                 "headers": self.raw_headers}  # fmt: skip
        await send(start)
        body = bytes(self.body)
        for offset in range(0, len(body), CHUNK_BYTES):
            piece = body[offset : offset + CHUNK_BYTES]
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            if await request.is_disconnected():
                return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True
