"""The embedded broker never outlives the process that started it."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PARENT = """
import time
from kmq.dev.embedded import EmbeddedBroker
broker = EmbeddedBroker().start()
print(broker.process.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_embedded_broker_dies_with_its_sigkilled_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    broker_pid = None
    try:
        assert parent.stdout is not None
        broker_pid = int(parent.stdout.readline())
        exited = os.pidfd_open(broker_pid)  # readable once the broker has exited
        try:
            assert select.select([exited], [], [], 0)[0] == [], "broker not running"
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait(timeout=10)
            readable, _, _ = select.select([exited], [], [], 10)
            assert readable == [exited], f"broker {broker_pid} outlived its SIGKILLed parent"
        finally:
            os.close(exited)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if broker_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(broker_pid, signal.SIGKILL)
