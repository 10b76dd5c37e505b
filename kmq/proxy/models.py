"""The native API's request and response bodies (pydantic). Validation only: no I/O.

Payloads and header values are base64 (standard or URL-safe, padding optional) so that any
bytes travel through JSON. Requests are strict: ``"5"`` is not a number, unknown fields
are refused.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from kmq.errors import InvalidMessageError
from kmq.proxy.config import MAX_BATCH, MAX_RECEIVE, MAX_WAIT_S
from kmq.records import MAX_REASON_CHARS
from kmq.validation import check_headers

_B64_RE = re.compile(r"[A-Za-z0-9+/_-]*={0,2}")


def decode_base64(value: object) -> bytes:
    """Standard or URL-safe base64, padding optional; anything else is a ValueError."""
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    if not _B64_RE.fullmatch(value):
        raise ValueError("is not base64")
    text = value.rstrip("=").replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64") from None


def encode_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


Base64 = Annotated[
    bytes,
    BeforeValidator(decode_base64),
    WithJsonSchema({"type": "string", "format": "byte", "description": "base64"}),
]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class MessageIn(_In):
    body: Base64 = Field(description="The payload, base64.")
    headers: dict[str, Base64] = Field(
        default_factory=dict,
        max_length=100,
        description="Your headers: names (not starting with 'kmq.') to base64 values.",
    )

    @model_validator(mode="after")
    def _check_headers(self) -> MessageIn:
        try:
            check_headers(self.headers)
        except InvalidMessageError as exc:
            raise ValueError(str(exc)) from None
        return self


class SendBatchIn(_In):
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_BATCH)


class ReceiveIn(_In):
    max_messages: int = Field(1, ge=1, le=MAX_RECEIVE)
    wait_s: float = Field(0.0, ge=0, le=MAX_WAIT_S, description="Long poll: wait this long "
                          "for the first message.")  # fmt: skip
    visibility_s: float | None = Field(
        None,
        gt=0,
        le=MAX_REDELIVERY_TIMEOUT_S,
        description="Lease of each message handed out; default: the server's.",
    )


class ReceiptsIn(_In):
    receipts: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class NackIn(ReceiptsIn):
    delay_s: float | None = Field(
        None,
        ge=0,
        le=MAX_REDELIVERY_TIMEOUT_S,
        description="Redeliver after this long; default: the queue's retry backoff.",
    )
    reason: str = Field("", max_length=MAX_REASON_CHARS)


class ExtendIn(ReceiptsIn):
    visibility_s: float = Field(gt=0, le=MAX_REDELIVERY_TIMEOUT_S,
                                description="The new lease, from now.")  # fmt: skip


class RejectIn(ReceiptsIn):
    reason: str = Field("rejected", max_length=MAX_REASON_CHARS)


# -- responses (documentation: the handlers build these as plain dicts) -----------------------


class SentOut(BaseModel):
    id: str


class FailedItem(BaseModel):
    index: int
    code: str
    message: str


class SentBatchOut(BaseModel):
    ids: list[str | None] = Field(description="Each message's id, null where it failed.")
    failed: list[FailedItem]


class MessageOut(BaseModel):
    id: str
    queue: str
    attempt: int = Field(description="1 on first delivery.")
    body: str = Field(description="The payload, base64.")
    headers: dict[str, str] = Field(description="Header values, base64.")
    sent_at_ms: int = Field(description="When this copy was written (epoch ms).")
    receipt: str = Field(description="Settles this delivery, through any replica.")
    visibility_s: float
    receipt_expires_at_ms: int


class ReceiveOut(BaseModel):
    messages: list[MessageOut]


class SettledOut(BaseModel):
    settled: int


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


class QueueOut(BaseModel):
    queue: str
    approximate_waiting: int = Field(
        description="Messages no consumer has taken yet (an upper bound on shared partitions)."
    )
