"""The marker codec: typed markers to and from the protobuf bytes on the markers topic."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from kmq._proto import marker_pb2
from kmq.errors import MarkerDecodeError

PROTOCOL_VERSION = 1
MAX_ATTEMPT = 2**32 - 1
"""The attempt field is a uint32: larger attempt numbers cannot be encoded."""


class MarkerType(enum.IntEnum):
    START = marker_pb2.START
    KEEPALIVE = marker_pb2.KEEPALIVE
    END = marker_pb2.END
    NACK = marker_pb2.NACK
    REDELIVERED = marker_pb2.REDELIVERED
    RELEASE = marker_pb2.RELEASE
    DEAD_LETTERED = marker_pb2.DEAD_LETTERED


_KNOWN_TYPES = frozenset(int(t) for t in MarkerType)
BATCH = marker_pb2.BATCH
"""Type of a record that carries several markers in its ``batch`` field."""


@dataclass(frozen=True, slots=True)
class Marker:
    """One marker. ``(partition, offset)`` names the delivered queue-topic record."""

    type: MarkerType
    queue: str
    partition: int
    offset: int
    message_id: str
    attempt: int
    redeliver_after_ms: int = 0
    key: bytes = b""
    value: bytes = b""
    headers: tuple[tuple[str, bytes], ...] = field(default=())
    reason: str = ""
    max_attempts: int = 0
    dead_letter_queue: str = ""
    version: int = PROTOCOL_VERSION

    @property
    def delivery(self) -> tuple[int, int]:
        """The queue-topic record this marker is about: ``(partition, offset)``."""
        return (self.partition, self.offset)


def _fields(marker: Marker) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "version": marker.version,
        "type": int(marker.type),
        "queue": marker.queue,
        "partition": marker.partition,
        "offset": marker.offset,
        "message_id": marker.message_id,
        "attempt": marker.attempt,
    }
    # Only what is set: protobuf skips default values on the wire anyway.
    if marker.redeliver_after_ms:
        fields["redeliver_after_ms"] = marker.redeliver_after_ms
    if marker.key:
        fields["key"] = marker.key
    if marker.value:
        fields["value"] = marker.value
    if marker.headers:
        fields["headers"] = [marker_pb2.Header(key=k, value=v) for k, v in marker.headers]
    if marker.reason:
        fields["reason"] = marker.reason
    if marker.max_attempts:
        fields["max_attempts"] = marker.max_attempts
    if marker.dead_letter_queue:
        fields["dead_letter_queue"] = marker.dead_letter_queue
    return fields


def encode(marker: Marker) -> bytes:
    """Serialize a marker to its wire bytes."""
    return marker_pb2.Marker(**_fields(marker)).SerializeToString()


def encode_batch(markers: Sequence[Marker]) -> bytes:
    """One record's worth of markers, applied in order: a plain marker when there is one."""
    if len(markers) == 1:
        return encode(markers[0])
    return marker_pb2.Marker(
        version=PROTOCOL_VERSION,
        type=marker_pb2.BATCH,
        batch=[marker_pb2.Marker(**_fields(m)) for m in markers],
    ).SerializeToString()


def parse(data: bytes | None) -> marker_pb2.Marker:
    """Parse and validate wire bytes, returning the protobuf message itself (no copies).

    A BATCH comes back as is: check each of its ``batch`` entries with :func:`check`.
    Raises :class:`kmq.MarkerDecodeError` for anything that is not a well-formed marker of
    a version this code understands: the tracker counts and skips those.
    """
    if data is None:
        raise MarkerDecodeError("marker record has no value")
    pb = marker_pb2.Marker()
    try:
        pb.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise MarkerDecodeError(f"not a protobuf marker: {exc}") from None
    if pb.type == marker_pb2.BATCH and pb.version == PROTOCOL_VERSION:
        return pb
    check(pb)
    return pb


def check(pb: marker_pb2.Marker) -> None:
    """Raise :class:`kmq.MarkerDecodeError` unless ``pb`` is a valid single marker."""
    if pb.version != PROTOCOL_VERSION:
        raise MarkerDecodeError(f"unsupported marker version {pb.version}")
    if pb.type not in _KNOWN_TYPES:
        raise MarkerDecodeError(f"unknown marker type {pb.type}")
    if not pb.message_id:
        raise MarkerDecodeError("marker has no message id")
    if pb.partition < 0 or pb.offset < 0:
        raise MarkerDecodeError(f"marker names record {pb.partition}:{pb.offset}")


def from_pb(pb: marker_pb2.Marker) -> Marker:
    """The typed :class:`Marker` of a message returned by :func:`parse`."""
    return Marker(
        type=MarkerType(pb.type),
        queue=pb.queue,
        partition=pb.partition,
        offset=pb.offset,
        message_id=pb.message_id,
        attempt=pb.attempt,
        redeliver_after_ms=pb.redeliver_after_ms,
        key=pb.key,
        value=pb.value,
        headers=tuple((h.key, h.value) for h in pb.headers),
        reason=pb.reason,
        max_attempts=pb.max_attempts,
        dead_letter_queue=pb.dead_letter_queue,
        version=pb.version,
    )


def decode(data: bytes | None) -> Marker:
    """Parse wire bytes holding one marker into a :class:`Marker`; see :func:`parse`."""
    pb = parse(data)
    if pb.type == marker_pb2.BATCH:
        raise MarkerDecodeError(f"a batch of {len(pb.batch)} markers: use decode_all()")
    return from_pb(pb)


def decode_all(data: bytes | None) -> list[Marker]:
    """Every valid marker in a record, in order: one for a plain marker, several for a
    BATCH (whose invalid entries are left out). Raises like :func:`parse`."""
    pb = parse(data)
    if pb.type != marker_pb2.BATCH:
        return [from_pb(pb)]
    out = []
    for entry in pb.batch:
        try:
            check(entry)
        except MarkerDecodeError:
            continue
        out.append(from_pb(entry))
    return out
