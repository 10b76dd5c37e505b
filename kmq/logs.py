"""Logging for kmq's long-running commands: plain text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_STANDARD = frozenset(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", ...extra fields, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = value if isinstance(value, (str, int, float, bool)) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def kafka_level(level: str) -> int:
    """kafka-python's own log level for a process logging at ``level``. It logs every
    failed connection attempt at ERROR, with a traceback, many times a second while a
    broker is down; kmq says what matters in one line, so below DEBUG it stays silent."""
    return logging.WARNING if level.upper() == "DEBUG" else logging.CRITICAL


def configure(log_format: str, level: str, stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (default stdout) as text or JSON lines."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stdout)
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kafka").setLevel(kafka_level(level))
