"""Reaching Kafka at start-up: say once why it cannot be reached, then retry with backoff
(1 s, doubling up to 30 s) instead of dying with a traceback."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator

from kmq.errors import BrokerError

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0


def delays() -> Iterator[float]:
    """1 s, 2 s, 4 s ... then 30 s for ever."""
    delay = RETRY_MIN_S
    for _ in itertools.count():
        yield delay
        delay = min(delay * 2, RETRY_MAX_S)


def until_reachable(
    attempt: Callable[[], object], log: logging.Logger, stop: threading.Event | None = None
) -> bool:
    """Call ``attempt`` until it raises no :class:`kmq.BrokerError`; False if ``stop`` is set
    first. Logs the error once, and again only when its text changes."""
    stop = stop if stop is not None else threading.Event()
    said = ""
    for delay_s in delays():
        if stop.is_set():
            return False
        try:
            attempt()
        except BrokerError as exc:
            if str(exc) != said:
                said = str(exc)
                log.error("%s; retrying in %g s, then at most every %g s", exc, delay_s,
                          RETRY_MAX_S)  # fmt: skip
            stop.wait(delay_s)
            continue
        return True
    return False  # pragma: no cover - delays() never ends
