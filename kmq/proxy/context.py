"""What every request handler of one replica shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from starlette.requests import Request

from kmq.proxy.backend import Delivery, KafkaSide
from kmq.proxy.config import ProxyConfig
from kmq.proxy.handles import HandleCodec, HandleError, Opened


@dataclass
class Proxy:
    config: ProxyConfig
    backend: KafkaSide
    codec: HandleCodec
    max_message_bytes: int = 1_000_000

    def handles(
        self, deliveries: Sequence[Delivery], now_ms: int | None = None
    ) -> tuple[list[str], int]:
        """Signed handles for ``deliveries`` and the epoch ms at which they expire."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        expires_ms = now_ms + round(self.config.handle_ttl_s * 1000)
        return [self.codec.sign(d.receipt, expires_ms) for d in deliveries], expires_ms

    def open(self, handle: object, now_ms: int | None = None) -> Opened:
        """Raises :class:`kmq.proxy.handles.HandleError`."""
        return self.codec.open(handle, now_ms if now_ms is not None else int(time.time() * 1000))


def proxy(request: Request) -> Proxy:
    return cast(Proxy, request.app.state.proxy)


async def watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client hangs up (the request body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


__all__ = ["HandleError", "Proxy", "proxy", "watch_disconnect"]
