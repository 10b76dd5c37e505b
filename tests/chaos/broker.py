"""The embedded Tansu broker, listening on one port and advertising another (the proxy's).

Kafka clients learn broker addresses from metadata, so a proxy on another port is only used
after bootstrap if the broker advertises the proxy's address: every client then talks to the
broker through the proxy. :class:`kmq.embedded.EmbeddedBroker` advertises its own port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from kmq.embedded import broker_binary, free_port
from kmq.errors import BrokerError


class ProxiedBroker:
    """Tansu on ``127.0.0.1:port``, advertising ``127.0.0.1:advertised_port``."""

    def __init__(self, advertised_port: int, log_path: Path) -> None:
        self.port = free_port()
        self.advertised_port = advertised_port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> ProxiedBroker:
        with self.log_path.open("ab") as log:
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
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise BrokerError(f"Tansu exited with code {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise BrokerError(f"Tansu did not listen on port {self.port}") from None
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
            process.wait(timeout=30)
