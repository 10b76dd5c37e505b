"""A fault-injecting TCP proxy on 127.0.0.1, in front of the broker.

Every client connection gets its own upstream connection and two pump threads. Faults:

- :meth:`FaultProxy.reset`: abort some or all live connections (``SO_LINGER`` 0, so the
  peers see a reset rather than an orderly close); the clients reconnect.
- :meth:`FaultProxy.stall`: stop forwarding bytes, both ways, on some or all connections for
  a while; a stall of every connection also holds connections opened during it. Bytes are
  held, never dropped: when the stall ends they flow on.

Each fault is recorded with its real start and end times (:attr:`FaultProxy.faults`).
"""

from __future__ import annotations

import contextlib
import functools
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_CHUNK = 256 * 1024
_WAIT_S = 0.05


@dataclass(frozen=True)
class Fault:
    kind: str
    """``reset`` or ``stall``."""
    start: float
    """Real wall time the fault began."""
    end: float
    """Real wall time it ended (``start`` for a reset)."""
    connections: int
    """How many live connections it hit."""
    everything: bool
    """True if it hit every connection (a stall of everything also holds new ones)."""


class _Link:
    """One proxied connection: the client's socket and ours to the broker."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.flowing = threading.Event()
        self.flowing.set()
        self.dead = threading.Event()
        self._pumps_left = 2
        self._lock = threading.Lock()

    def abort(self) -> None:
        """Reset both sides. Only shuts the sockets down: the last pump closes them, so no
        thread ever uses a file descriptor number that was closed and reused."""
        self.dead.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def pump_done(self) -> None:
        self.abort()
        with self._lock:
            self._pumps_left -= 1
            last = self._pumps_left == 0
        if last:
            self.client.close()
            self.upstream.close()


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:upstream_port``. Bind first (the port is
    known at once), then :meth:`start` once the upstream port is known."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port: int = self._server.getsockname()[1]
        self.upstream_port: int | None = None
        self.faults: list[Fault] = []
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._all_flowing = threading.Event()
        self._all_flowing.set()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stall_lock = threading.Lock()
        self._acceptor: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, upstream_port: int) -> FaultProxy:
        self.upstream_port = upstream_port
        self._server.settimeout(0.2)
        self._acceptor = self._spawn(self._accept_loop, "chaos-proxy-accept")
        return self

    def connections(self) -> int:
        with self._lock:
            return len(self._links)

    # -- faults -----------------------------------------------------------------------

    def reset(self, rng: random.Random, fraction: float = 1.0) -> Fault:
        """Abort each live connection with probability ``fraction`` (all of them at 1.0)."""
        now = time.time()
        with self._lock:
            hit = [link for link in self._links if fraction >= 1.0 or rng.random() < fraction]
        for link in hit:
            link.abort()
        fault = Fault("reset", now, now, len(hit), fraction >= 1.0)
        self.faults.append(fault)
        return fault

    def stall(self, rng: random.Random, duration_s: float, fraction: float = 1.0) -> Fault:
        """Hold every byte on each live connection with probability ``fraction`` (on every
        connection, new ones included, at 1.0) for ``duration_s``; blocks that long."""
        with self._stall_lock:  # one stall at a time
            start = time.time()
            everything = fraction >= 1.0
            with self._lock:
                hit = [link for link in self._links if everything or rng.random() < fraction]
                if everything:
                    self._all_flowing.clear()
                for link in hit:
                    link.flowing.clear()
            self._closed.wait(duration_s)  # the fault itself: time-driven by design
            with self._lock:
                self._all_flowing.set()
                for link in self._links if everything else hit:
                    link.flowing.set()
            fault = Fault("stall", start, time.time(), len(hit), everything)
            self.faults.append(fault)
            return fault

    def stall_in_background(
        self, rng: random.Random, duration_s: float, fraction: float = 1.0
    ) -> threading.Thread:
        """:meth:`stall` on a thread of its own; join the returned thread to await its end."""
        return self._spawn(lambda: self.stall(rng, duration_s, fraction), "chaos-proxy-stall")

    # -- plumbing ---------------------------------------------------------------------

    def _spawn(self, target: Callable[[], object], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    def _accept_loop(self) -> None:
        assert self.upstream_port is not None
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream)
            with self._lock:
                if not self._all_flowing.is_set():
                    link.flowing.clear()  # a stall of everything holds new connections too
                self._links.add(link)
            self._spawn(functools.partial(self._pump, link, True), "chaos-proxy-up")
            self._spawn(functools.partial(self._pump, link, False), "chaos-proxy-down")

    def _pump(self, link: _Link, upstream: bool) -> None:
        src, dst = (link.client, link.upstream) if upstream else (link.upstream, link.client)
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    return
                while not link.flowing.wait(_WAIT_S):
                    if link.dead.is_set() or self._closed.is_set():
                        return
                dst.sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._links.discard(link)
            link.pump_done()

    def close(self) -> None:
        """Stop accepting, end every stall, abort every connection, join every thread."""
        self._closed.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout=5)  # it checks _closed at least every 0.2 s
        self._server.close()
        with self._lock:
            self._all_flowing.set()
            links = list(self._links)
            threads = list(self._threads)
        for link in links:
            link.flowing.set()
            link.abort()
        for thread in threads:
            thread.join(timeout=5)
