"""Receipt handles: signed, self-contained, refused when forged, tampered or expired."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq.proxy.handles import MAX_HANDLE_CHARS, HandleCodec, HandleError
from kmq.receipts import Receipt

SECRET = b"a-deployment-secret-0123"
RECEIPT = Receipt("emails", "0123456789abcdef", 1, 7, 123456, 3, 2)
NOW = 1_700_000_000_000


def raw(handle: str) -> bytearray:
    return bytearray(base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)))


def text(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_handle_opens_to_its_receipt_and_expiry_on_any_replica() -> None:
    handle = HandleCodec([SECRET]).sign(RECEIPT, NOW + 5000)
    opened = HandleCodec([SECRET]).open(handle, NOW)  # another replica: same secret
    assert (opened.receipt, opened.expires_ms) == (RECEIPT, NOW + 5000)
    assert handle.isascii() and "=" not in handle and len(handle) < MAX_HANDLE_CHARS


def test_every_changed_byte_is_refused() -> None:
    codec = HandleCodec([SECRET])
    handle = codec.sign(RECEIPT, NOW + 5000)
    data = raw(handle)
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            changed = bytearray(data)
            changed[i] ^= bit
            with pytest.raises(HandleError) as info:
                codec.open(text(bytes(changed)), NOW)
            assert info.value.reason == "invalid"


def test_a_handle_signed_with_another_secret_is_refused() -> None:
    forged = HandleCodec([b"someone-elses-secret-000"]).sign(RECEIPT, NOW + 5000)
    with pytest.raises(HandleError, match="not authentic"):
        HandleCodec([SECRET]).open(forged, NOW)


def test_an_expired_handle_is_refused_from_its_expiry_on() -> None:
    codec = HandleCodec([SECRET])
    handle = codec.sign(RECEIPT, NOW + 5000)
    assert codec.open(handle, NOW + 4999).receipt == RECEIPT
    for now in (NOW + 5000, NOW + 10**9):
        with pytest.raises(HandleError) as info:
            codec.open(handle, now)
        assert info.value.reason == "expired"


def test_rotation_new_secret_signs_old_still_verifies() -> None:
    old = HandleCodec([SECRET]).sign(RECEIPT, NOW + 5000)
    rotated = HandleCodec([b"the-new-secret-012345678", SECRET])
    assert rotated.open(old, NOW).receipt == RECEIPT
    new = rotated.sign(RECEIPT, NOW + 5000)
    with pytest.raises(HandleError):
        HandleCodec([SECRET]).open(new, NOW)


@pytest.mark.parametrize(
    "bad", [None, 5, b"bytes", "", "!!!!", "a", "AAAA", "x" * (MAX_HANDLE_CHARS + 1), "===="]
)
def test_malformed_handles_are_refused(bad: object) -> None:
    with pytest.raises(HandleError) as info:
        HandleCodec([SECRET]).open(bad, NOW)
    assert info.value.reason == "invalid"


@given(st.binary(max_size=200))
def test_random_bytes_never_open(data: bytes) -> None:
    with pytest.raises(HandleError):
        HandleCodec([SECRET]).open(text(data), NOW)


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError):
        HandleCodec([b"short"])
    with pytest.raises(ValueError):
        HandleCodec([])
