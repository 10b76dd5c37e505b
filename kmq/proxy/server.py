"""Running one replica: uvicorn (httptools, uvloop where installed), TLS if given, and a
shutdown that first answers every waiting long poll."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

import uvicorn

from kmq.proxy.app import create_app
from kmq.proxy.backend import Backend
from kmq.proxy.config import ProxyConfig
from kmq.service import Service

log = logging.getLogger("kmq.proxy")


@dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8080
    certfile: str | None = None
    keyfile: str | None = None
    access_log: bool = False


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, backend: Backend, url: str) -> None:
        super().__init__(config)
        self._backend = backend
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else 0
            log.info("kmq serve listening on %s:%d", self._url, port)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._backend.stop_waiting()  # long polls answer now, so connections can close
        await super().shutdown(sockets)


def serve(service: Service, config: ProxyConfig, listen: Listen) -> None:
    """Serve until SIGTERM or SIGINT; then finish requests, release what is buffered and
    close the consumers."""
    backend = Backend(
        service,
        prefetch=config.prefetch,
        consumer_idle_s=config.consumer_idle_s,
        threads=config.threads,
        policy=config.policy,
        counts_cache_s=config.counts_cache_s,
    )
    app = create_app(config, backend, max_message_bytes=service.config.max_message_bytes)
    uv = uvicorn.Config(
        app,
        host=listen.host,
        port=listen.port,
        ssl_certfile=listen.certfile,
        ssl_keyfile=listen.keyfile,
        log_config=None,
        access_log=listen.access_log,
        server_header=False,
        timeout_graceful_shutdown=30,
        timeout_keep_alive=30,
    )
    scheme = "https" if listen.certfile else "http"
    host = f"[{listen.host}]" if ":" in listen.host else listen.host
    _Server(uv, backend, f"{scheme}://{host}").run()
