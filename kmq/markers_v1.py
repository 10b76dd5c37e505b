"""Reading version 1 markers (protobuf, ``proto/marker.proto``), written by kmq 0.1.

A version 1 START carried the payload; kmq 0.2 ignores it and re-reads the queue record the
marker names, as it does for version 2. :func:`encode_v1` exists for tests of that upgrade.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError

from kmq._proto import marker_pb2
from kmq.errors import MarkerDecodeError
from kmq.markers import (
    MAX_AFTER_MS,
    MAX_ATTEMPT,
    QUEUE_LANE,
    Entry,
    Marker,
    MarkerType,
    check_entry,
)

VERSION = 1
BATCH = marker_pb2.BATCH
_V1_TYPES = frozenset(range(1, 8))  # START .. DEAD_LETTERED; 8 was BATCH in version 1
_START = int(MarkerType.START)


def _pb(data: bytes) -> marker_pb2.Marker:
    pb = marker_pb2.Marker()
    try:
        pb.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise MarkerDecodeError(f"not a protobuf marker: {exc}") from None
    return pb


def _problem(pb: marker_pb2.Marker) -> str | None:
    if pb.version != VERSION:
        return f"unsupported marker version {pb.version}"
    if pb.type not in _V1_TYPES:
        return f"unknown marker type {pb.type}"
    if not pb.message_id:
        return "marker has no message id"
    if pb.partition < 0 or pb.offset < 0:
        return f"marker names record {pb.partition}:{pb.offset}"
    return None


def _entry(pb: marker_pb2.Marker) -> tuple[Entry, bytes]:
    # An invalid entry gets type 0, which check_entry() reports as unknown.
    kind = pb.type if _problem(pb) is None else 0
    text = (pb.dead_letter_queue if kind == _START else pb.reason).encode()
    after = min(max(pb.redeliver_after_ms, 0), MAX_AFTER_MS)
    return (
        (kind, QUEUE_LANE, pb.partition, pb.offset, pb.attempt, after, pb.max_attempts, len(text)),
        text,
    )


def _records(data: bytes) -> list[marker_pb2.Marker]:
    pb = _pb(data)
    if pb.type == BATCH and pb.version == VERSION:
        return list(pb.batch)
    problem = _problem(pb)
    if problem is not None:
        raise MarkerDecodeError(problem)
    return [pb]


def parse_v1(data: bytes) -> tuple[list[Entry], list[bytes]]:
    """Entries and texts of a version 1 record, as :func:`kmq.markers.parse` gives them."""
    pairs = [_entry(pb) for pb in _records(data)]
    return [e for e, _ in pairs], [t for _, t in pairs]


def _marker(pb: marker_pb2.Marker) -> Marker:
    kind = MarkerType(pb.type)
    return Marker(
        type=kind,
        partition=pb.partition,
        offset=pb.offset,
        attempt=pb.attempt,
        redeliver_after_ms=min(max(pb.redeliver_after_ms, 0), MAX_AFTER_MS),
        max_attempts=pb.max_attempts,
        reason=pb.reason,
        dead_letter_queue=pb.dead_letter_queue,
        lane=QUEUE_LANE,
        version=VERSION,
        queue=pb.queue,
        message_id=pb.message_id,
    )


def decode_all_v1(data: bytes) -> list[Marker]:
    return [_marker(pb) for pb in _records(data) if _problem(pb) is None]


def decode_v1(data: bytes) -> Marker:
    records = _records(data)
    if len(records) != 1:
        raise MarkerDecodeError(f"a batch of {len(records)} markers: use decode_all()")
    problem = _problem(records[0]) or check_entry(_entry(records[0])[0])
    if problem is not None:
        raise MarkerDecodeError(problem)
    return _marker(records[0])


def _fields(f: dict[str, Any]) -> dict[str, Any]:
    out = {"version": VERSION, **f}
    if "type" in out:
        out["type"] = int(out["type"])
    if "headers" in out:
        out["headers"] = [marker_pb2.Header(key=k, value=v) for k, v in out["headers"]]
    return out


def encode_v1(**fields: Any) -> bytes:
    """A version 1 marker from its protobuf fields (``headers`` as ``(name, bytes)`` pairs)."""
    return marker_pb2.Marker(**_fields(fields)).SerializeToString()


def encode_batch_v1(markers: Sequence[dict[str, Any]]) -> bytes:
    """A version 1 BATCH record of markers given as protobuf fields."""
    return marker_pb2.Marker(
        version=VERSION, type=BATCH, batch=[marker_pb2.Marker(**_fields(m)) for m in markers]
    ).SerializeToString()


__all__ = ["MAX_ATTEMPT", "decode_all_v1", "decode_v1", "encode_batch_v1", "encode_v1", "parse_v1"]
