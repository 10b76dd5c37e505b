"""Logging for ``kmq serve``: :mod:`kmq.logs` on stderr, with uvicorn's loggers sent
through the same handler."""

from __future__ import annotations

import logging
import sys

from kmq import logs


def configure(log_format: str, level: str) -> None:
    logs.configure(log_format, level, sys.stderr)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
