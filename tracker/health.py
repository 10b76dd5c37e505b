"""Is Kafka reachable (:class:`BrokerLink`), and the tracker's HTTP port
(:class:`ProbeServer`): ``/metrics``, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING

from tracker.view import TrackerView

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("kmq.tracker")

BACK_AFTER_S = 1.0
"""Kafka counts as back after clean rounds for this long (one alone can be luck)."""


class BrokerLink:
    """Whether Kafka answers, as the run loop finds out. Logs one line when it is lost and
    one when it is back, never one per failed request. Owned by the run loop; other
    threads only read :attr:`up` and :attr:`problem`."""

    def __init__(self, servers: str, grace_s: float) -> None:
        self.servers = servers
        self.up = False
        self.problem = "not connected yet"
        self._grace_s = grace_s
        """How long the group coordinator may stay unknown before Kafka counts as lost
        (it is unknown for a moment while a group forms or moves)."""
        self._down_since: float | None = None
        self._no_coordinator_since: float | None = None
        self._failed = False
        self._clean_since: float | None = None

    def connected(self, now: float) -> None:
        self.up, self.problem = True, ""
        self._down_since = None
        self._no_coordinator_since = now
        log.info("connected to Kafka at %s", self.servers)

    def begin_round(self) -> None:
        self._failed = False

    def failed(self, cause: str, now: float) -> None:
        """A request failed because Kafka could not be reached."""
        self._failed = True
        self.problem = cause
        if self.up:
            self.up = False
            self._down_since = now
            log.warning(
                "lost Kafka at %s: %s; retrying, not ready until it is back", self.servers, cause
            )

    def end_round(self, coordinator_known: bool, now: float) -> None:
        """The round is over: with no failure and a known coordinator, Kafka is back."""
        if coordinator_known:
            self._no_coordinator_since = None
        elif self._no_coordinator_since is None:
            self._no_coordinator_since = now
        elif now - self._no_coordinator_since > self._grace_s and self.up:
            self.failed("its group coordinator does not answer", now)
        if self._failed or not coordinator_known:
            self._clean_since = None
            return
        if self.up:
            return
        if self._clean_since is None:
            self._clean_since = now
        if now - self._clean_since < BACK_AFTER_S:
            return
        self.up, self.problem = True, ""
        down_s = now - self._down_since if self._down_since is not None else 0.0
        self._down_since = None
        log.info("Kafka at %s is back after %.1f s", self.servers, down_s)


class ProbeServer:
    """One thread serving ``/metrics`` (Prometheus text), ``/healthz`` (the run loop turned
    within ``liveness_timeout_s``, or is still connecting) and ``/readyz`` (see
    :meth:`TrackerView.problems`). Both probes answer 200 or 503 with a JSON body."""

    def __init__(
        self,
        port: int,
        view: Callable[[], TrackerView],
        registry: CollectorRegistry,
        liveness_timeout_s: float,
        host: str = "0.0.0.0",  # probes and scrapes come from outside the pod
    ) -> None:
        from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

        def alive() -> tuple[bool, dict[str, object]]:
            v = view()
            ok = v.connecting or v.last_turn_age_s < liveness_timeout_s
            return ok, {"alive": ok, "last_turn_age_s": round(v.last_turn_age_s, 3)}

        def ready() -> tuple[bool, dict[str, object]]:
            v = view()
            problems = v.problems()
            partitions = [p.partition for p in v.partitions]
            return not problems, {"ready": not problems, "problems": problems,
                                  "partitions": partitions}  # fmt: skip

        class Handler(BaseHTTPRequestHandler):
            timeout = 5.0

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                elif path in ("/healthz", "/readyz"):
                    ok, body = alive() if path == "/healthz" else ready()
                    self._send(200 if ok else 503, "application/json", json.dumps(body).encode())
                else:
                    self._send(404, "text/plain", b"/metrics, /healthz or /readyz\n")

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would flood the log

        self._server = HTTPServer((host, port), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kmq-tracker-probes", daemon=True
        )

    def start(self) -> ProbeServer:
        self._thread.start()
        log.info("metrics and probes on port %d (/metrics, /healthz, /readyz)", self.port)
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
