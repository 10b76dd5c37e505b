"""Receipt handles: a :class:`kmq.Receipt` plus an expiry, signed with HMAC-SHA256.

A handle is self-contained, so any proxy replica that knows the shared secret can settle
the delivery it names without asking the replica that handed it out. Layout (then
base64url without padding): version (1 byte), expiry in epoch milliseconds (8 bytes),
``Receipt.encode()``, HMAC-SHA256 of everything before it (32 bytes). Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from kmq.errors import InvalidArgumentError
from kmq.receipts import Receipt

VERSION = 1
MIN_SECRET_BYTES = 16
_HEAD = struct.Struct(">BQ")
_MAC_BYTES = 32
MAX_HANDLE_CHARS = 1024
"""SQS's own limit on a receipt handle's length; ours are far shorter."""


class HandleError(Exception):
    """A handle this proxy will not act on. ``reason`` is ``invalid`` (malformed, forged
    or tampered: told apart by no one) or ``expired``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Opened:
    receipt: Receipt
    expires_ms: int


class HandleCodec:
    """Signs receipts into handles and opens them again. The first secret signs; every
    secret verifies, so a new secret can be rolled out before the old one is dropped."""

    def __init__(self, secrets: Sequence[bytes]) -> None:
        if not secrets:
            raise ValueError("at least one secret is needed")
        for secret in secrets:
            if len(secret) < MIN_SECRET_BYTES:
                raise ValueError(f"a secret must be at least {MIN_SECRET_BYTES} bytes long")
        self._keys = tuple(bytes(s) for s in secrets)

    def _mac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, hashlib.sha256).digest()

    def sign(self, receipt: Receipt, expires_ms: int) -> str:
        data = _HEAD.pack(VERSION, expires_ms) + receipt.encode()
        raw = data + self._mac(self._keys[0], data)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def open(self, handle: object, now_ms: int) -> Opened:
        """The receipt a handle names, if it is authentic and not expired at ``now_ms``."""
        if not isinstance(handle, str) or not handle or len(handle) > MAX_HANDLE_CHARS:
            raise HandleError("invalid", "the receipt handle is malformed")
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        except (binascii.Error, ValueError):
            raise HandleError("invalid", "the receipt handle is malformed") from None
        if len(raw) <= _HEAD.size + _MAC_BYTES:
            raise HandleError("invalid", "the receipt handle is malformed")
        data, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if not any(hmac.compare_digest(self._mac(key, data), mac) for key in self._keys):
            raise HandleError("invalid", "the receipt handle is not authentic")
        version, expires_ms = _HEAD.unpack_from(data)
        if version != VERSION:
            raise HandleError("invalid", "the receipt handle is of an unknown version")
        try:
            receipt = Receipt.decode(data[_HEAD.size :])
        except InvalidArgumentError:  # signed by us, so only a kmq version change does this
            raise HandleError("invalid", "the receipt handle names no delivery") from None
        if now_ms >= expires_ms:
            raise HandleError("expired", "the receipt handle has expired")
        return Opened(receipt, expires_ms)
