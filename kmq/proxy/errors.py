"""Errors of the native API: one JSON shape, ``{"error": {"code": ..., "message": ...}}``,
and the mapping from kmq's exceptions to HTTP statuses. Pure."""

from __future__ import annotations

from typing import Any

from kmq.errors import (
    BrokerError,
    ConsumerClosedError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidQueueError,
    KmqError,
    MessageStateError,
    MessageTooLargeError,
)


class ApiError(Exception):
    """A 4xx/5xx answer of the native API."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


# Most specific first.
_KMQ: list[tuple[type[KmqError], int, str]] = [
    (MessageTooLargeError, 413, "message_too_large"),
    (InvalidQueueError, 400, "invalid_queue"),
    (InvalidMessageError, 400, "invalid_message"),
    (InvalidArgumentError, 400, "invalid_request"),
    (MessageStateError, 409, "conflict"),
    (ConsumerClosedError, 503, "unavailable"),
    (BrokerError, 503, "unavailable"),
    (KmqError, 500, "internal"),
]


def from_kmq(exc: KmqError) -> ApiError:
    """The API error for a kmq exception (broker trouble is a 503: try again)."""
    for kind, status, code in _KMQ:
        if isinstance(exc, kind):
            message = str(exc) if status < 500 or status == 503 else "internal error"
            return ApiError(status, code, message)
    return ApiError(500, "internal", "internal error")  # pragma: no cover - KmqError is last


def http_status_code(status: int) -> str:
    """A code for errors the framework raises itself (unknown routes, wrong methods)."""
    return {
        400: "invalid_request",
        401: "unauthenticated",
        403: "forbidden",
        404: "not_found",
        405: "method_not_allowed",
        413: "body_too_large",
        415: "unsupported_media_type",
    }.get(status, "internal" if status >= 500 else "invalid_request")
