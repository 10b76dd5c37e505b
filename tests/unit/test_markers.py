"""The marker codec: round trips, a pinned wire format, and robust decoding."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kmq
from kmq._proto import marker_pb2
from kmq.markers import (
    MAX_ATTEMPT,
    PROTOCOL_VERSION,
    Marker,
    MarkerType,
    decode,
    decode_all,
    encode,
    encode_batch,
)

SETTINGS = settings(max_examples=200, deadline=None)

GOLDEN_MARKER = Marker(
    type=MarkerType.START,
    queue="orders",
    partition=3,
    offset=123_456_789,
    message_id="0123456789abcdef0123456789abcdef",
    attempt=2,
    redeliver_after_ms=30_000,
    key=b"orders",
    value=b"\x00payload\xff",
    headers=(("trace-id", b"abc"), ("empty", b"")),
    reason="golden",
)
# Computed once from GOLDEN_MARKER. If this test fails, the wire format changed: old markers
# on the markers topic would no longer decode the same way.
GOLDEN_HEX = (
    "080110011a066f7264657273200328959aef3a3220303132333435363738396162636465663031323334"
    "35363738396162636465663802"
    "40b0ea014a066f72646572735209007061796c6f6164ff5a0f0a0874726163652d696412036162635a07"
    "0a05656d7074796206676f6c64656e"
)


def test_golden_bytes_encode() -> None:
    assert encode(GOLDEN_MARKER).hex() == GOLDEN_HEX


def test_golden_bytes_decode() -> None:
    assert decode(bytes.fromhex(GOLDEN_HEX)) == GOLDEN_MARKER


@pytest.mark.parametrize("marker_type", list(MarkerType))
def test_round_trip_every_type(marker_type: MarkerType) -> None:
    marker = dataclasses.replace(GOLDEN_MARKER, type=marker_type)
    decoded = decode(encode(marker))
    assert decoded == marker
    assert decoded.type is marker_type
    assert decoded.delivery == (marker.partition, marker.offset)


def test_marker_types_match_the_proto_enum() -> None:
    # BATCH is a container record, not a marker type of its own.
    proto_names = set(marker_pb2.MarkerType.keys()) - {"MARKER_TYPE_UNSPECIFIED", "BATCH"}
    assert {t.name for t in MarkerType} == proto_names
    for t in MarkerType:
        assert int(t) == marker_pb2.MarkerType.Value(t.name)


markers = st.builds(
    Marker,
    type=st.sampled_from(MarkerType),
    queue=st.text(),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    message_id=st.text(min_size=1),
    attempt=st.integers(0, MAX_ATTEMPT),
    redeliver_after_ms=st.integers(-(2**63), 2**63 - 1),
    key=st.binary(),
    value=st.binary(),
    headers=st.lists(st.tuples(st.text(), st.binary()), max_size=5).map(tuple),
    reason=st.text(),
)


@SETTINGS
@given(markers)
def test_round_trip_any_marker(marker: Marker) -> None:
    assert decode(encode(marker)) == marker


@SETTINGS
@given(st.binary(max_size=300))
def test_decode_random_bytes_returns_marker_or_raises_marker_decode_error(data: bytes) -> None:
    try:
        marker = decode(data)
    except kmq.MarkerDecodeError:
        return
    assert isinstance(marker, Marker)
    assert marker.version == PROTOCOL_VERSION
    assert marker.message_id
    assert marker.partition >= 0 and marker.offset >= 0


@SETTINGS
@given(markers, st.binary(max_size=20), st.integers(0, 400))
def test_decode_corrupted_marker_never_raises_anything_else(
    marker: Marker, junk: bytes, cut: int
) -> None:
    data = encode(marker)
    for mutated in (data[:cut], data[:cut] + junk + data[cut:], junk + data):
        with contextlib.suppress(kmq.MarkerDecodeError):
            assert isinstance(decode(mutated), Marker)


def _raw(**fields: Any) -> bytes:
    """A protobuf marker built field by field, bypassing the codec's own checks."""
    base: dict[str, Any] = {
        "version": PROTOCOL_VERSION,
        "type": marker_pb2.START,
        "partition": 0,
        "offset": 0,
        "message_id": "m",
    }
    return marker_pb2.Marker(**{**base, **fields}).SerializeToString()


def test_raw_helper_builds_a_valid_marker() -> None:
    assert decode(_raw()).message_id == "m"


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"version": 0}, "version"),
        ({"version": PROTOCOL_VERSION + 1}, "version"),
        ({"type": marker_pb2.MARKER_TYPE_UNSPECIFIED}, "type"),
        ({"type": 99}, "type"),
        ({"message_id": ""}, "message id"),
        ({"partition": -1}, "-1:0"),
        ({"offset": -1}, "0:-1"),
    ],
)
def test_decode_rejects_invalid_markers(fields: dict[str, object], complaint: str) -> None:
    with pytest.raises(kmq.MarkerDecodeError, match=complaint):
        decode(_raw(**fields))


@pytest.mark.parametrize("data", [None, b"\xff", b"\x0a\x05ab"])
def test_decode_rejects_non_markers(data: bytes | None) -> None:
    with pytest.raises(kmq.MarkerDecodeError):
        decode(data)


def test_marker_decode_error_is_a_kmq_error() -> None:
    assert issubclass(kmq.MarkerDecodeError, kmq.KmqError)


def test_batch_round_trip_keeps_order_and_drops_invalid_entries() -> None:
    ms = [
        Marker(MarkerType.START, "q", 0, 1, "a", 1, 1000, value=b"x"),
        Marker(MarkerType.KEEPALIVE, "q", 0, 1, "a", 1, 1000),
        Marker(MarkerType.END, "q", 0, 2, "b", 3),
    ]
    data = encode_batch(ms)
    assert decode_all(data) == ms
    with pytest.raises(kmq.MarkerDecodeError, match="decode_all"):
        decode(data)
    assert encode_batch(ms[:1]) == encode(ms[0])  # one marker is written plainly
    pb = marker_pb2.Marker()
    pb.ParseFromString(data)
    pb.batch.add(version=1, type=marker_pb2.BATCH, message_id="nested")
    pb.batch.add(version=1, type=marker_pb2.END, message_id="")
    assert decode_all(pb.SerializeToString()) == ms
