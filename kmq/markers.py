"""The marker codec: typed markers to and from the bytes on the markers topic.

Version 2 (written since kmq 0.2) is a fixed-size binary format: a marker names the queue
record it is about by lane (queue or retry topic), partition and offset, and carries no
payload, so every marker is 28 bytes plus an optional short text (a reason, or a START's
dead-letter queue). A record holds one or more markers of one markers partition::

    u8  version (2)      u32 count
    count x 28 bytes:    u8 type, u8 lane, i32 partition, i64 offset, u32 attempt,
                         u32 redeliver_after_ms, u32 max_attempts, u16 text length
    the texts, UTF-8, in marker order (only those with a length above 0)

all big-endian. Version 1 (protobuf, ``proto/marker.proto``; START carried the payload) is
still read: :mod:`kmq.markers_v1`. ``proto/README.md`` describes both.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from kmq.errors import MarkerDecodeError

PROTOCOL_VERSION = 2
MAX_ATTEMPT = 2**32 - 1
"""The attempt field is a uint32: larger attempt numbers cannot be encoded."""
MAX_AFTER_MS = 2**32 - 1
MAX_TEXT_BYTES = 2**16 - 1

QUEUE_LANE = 0
"""The marker names a record of the queue topic."""
RETRY_LANE = 1
"""The marker names a record of the retry topic."""
LANES = (QUEUE_LANE, RETRY_LANE)


class MarkerType(enum.IntEnum):
    START = 1  # a consumer took the delivery
    KEEPALIVE = 2  # the consumer still holds it: push the deadline out
    END = 3  # acked: never redeliver
    NACK = 4  # given back: redeliver after redeliver_after_ms, attempt + 1
    REDELIVERED = 5  # written by the tracker once the new copy is on the broker
    RELEASE = 6  # given back unseen (consumer closed): redeliver now, same attempt
    DEAD_LETTERED = 7  # moved to its dead-letter queue (rejected, or out of attempts)
    REJECT = 8  # dead-letter it now (written by anyone holding its receipt, e.g. the proxy)
    PROBE = 9  # a tracker's own mark of how far it has read: offset = its send time (ms),
    # attempt = the tracker's nonce; names no record
    WATCH = 10  # written by the tracker with REDELIVERED when it sent the copy to a spare
    # retry partition: names the copy (retry lane), watched until a consumer STARTs it;
    # text = the copy's queue. Not a delivery event


KNOWN_TYPES = frozenset(int(t) for t in MarkerType)

_HEADER = struct.Struct(">BI")
ENTRY = struct.Struct(">BBiqIIIH")
"""One marker: type, lane, partition, offset, attempt, redeliver_after_ms, max_attempts,
text length."""
ENTRY_BYTES = ENTRY.size
HEADER_BYTES = _HEADER.size

Entry = tuple[int, int, int, int, int, int, int, int]
"""A marker as :data:`ENTRY` packs it (the text is kept apart)."""


@dataclass(frozen=True, slots=True)
class Marker:
    """One marker. ``(lane, partition, offset)`` names the delivered record."""

    type: MarkerType
    partition: int
    offset: int
    attempt: int = 1
    redeliver_after_ms: int = 0
    max_attempts: int = 0
    reason: str = ""
    """NACK, RELEASE, REDELIVERED, DEAD_LETTERED: why."""
    dead_letter_queue: str = ""
    """START: where dead letters go, when not ``<queue>.dlq``."""
    lane: int = QUEUE_LANE
    version: int = PROTOCOL_VERSION
    queue: str = ""
    """Version 1 markers only (version 2 leaves it to the record the marker names)."""
    message_id: str = ""
    """Version 1 markers only."""

    @property
    def delivery(self) -> tuple[int, int]:
        """The queue-topic record this marker is about: ``(partition, offset)``."""
        return (self.partition, self.offset)

    @property
    def text(self) -> str:
        return self.dead_letter_queue if self.type is MarkerType.START else self.reason

    def entry(self) -> tuple[Entry, bytes]:
        """This marker as a packed-entry tuple and its text bytes."""
        text = self.text.encode()
        return (
            (
                int(self.type),
                self.lane,
                self.partition,
                self.offset,
                self.attempt,
                self.redeliver_after_ms,
                self.max_attempts,
                len(text),
            ),
            text,
        )


def encode_entries(entries: Sequence[Entry], texts: Sequence[bytes]) -> bytes:
    """One record's value from packed-entry tuples; ``texts`` holds the non-empty texts in
    entry order (those whose entry has a text length above 0)."""
    pack = ENTRY.pack
    return b"".join(
        (_HEADER.pack(PROTOCOL_VERSION, len(entries)), *[pack(*e) for e in entries], *texts)
    )


def encode_batch(markers: Sequence[Marker]) -> bytes:
    """Serialize markers, applied in this order, into one record value."""
    entries: list[Entry] = []
    texts: list[bytes] = []
    for marker in markers:
        _check_encodable(marker)
        entry, text = marker.entry()
        entries.append(entry)
        if text:
            texts.append(text)
    return encode_entries(entries, texts)


def encode(marker: Marker) -> bytes:
    """Serialize one marker."""
    return encode_batch([marker])


def _check_encodable(marker: Marker) -> None:
    if marker.lane not in LANES:
        raise ValueError(f"lane must be one of {LANES}, got {marker.lane}")
    if not 0 <= marker.attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt {marker.attempt} does not fit a uint32")
    if not 0 <= marker.redeliver_after_ms <= MAX_AFTER_MS:
        raise ValueError(f"redeliver_after_ms {marker.redeliver_after_ms} does not fit a uint32")
    if not 0 <= marker.max_attempts <= MAX_ATTEMPT:
        raise ValueError(f"max_attempts {marker.max_attempts} does not fit a uint32")
    if len(marker.text.encode()) > MAX_TEXT_BYTES:
        raise ValueError(f"a marker's text is limited to {MAX_TEXT_BYTES} bytes of UTF-8")


def parse(data: bytes | None) -> tuple[list[Entry], list[bytes]]:
    """The raw entries of a record, any version, and each entry's text (``b""`` if none).

    Entries come back unchecked: see :func:`check_entry`. Raises
    :class:`kmq.MarkerDecodeError` if the record as a whole is not a marker record of a
    version this code reads.
    """
    if data is None:
        raise MarkerDecodeError("marker record has no value")
    if data[:1] != b"\x02":
        from kmq.markers_v1 import parse_v1

        return parse_v1(data)
    size = len(data)
    if size < HEADER_BYTES:
        raise MarkerDecodeError(f"a {size}-byte record is too short for a marker header")
    _, count = _HEADER.unpack_from(data)
    end = HEADER_BYTES + count * ENTRY_BYTES
    if count == 0 or end > size:
        raise MarkerDecodeError(f"a {size}-byte record cannot hold {count} markers")
    entries: list[Entry] = list(ENTRY.iter_unpack(memoryview(data)[HEADER_BYTES:end]))
    if end == size and not any(e[7] for e in entries):
        return entries, [b""] * count
    texts: list[bytes] = []
    pos = end
    for entry in entries:
        n = entry[7]
        texts.append(data[pos : pos + n] if n else b"")
        pos += n
    if pos != size:
        raise MarkerDecodeError(f"marker texts take {pos - end} bytes, the record {size - end}")
    return entries, texts


def check_entry(entry: Entry) -> str | None:
    """Why an entry is not a valid marker, or ``None`` when it is."""
    if entry[0] not in KNOWN_TYPES:
        return f"unknown marker type {entry[0]}"
    if entry[1] not in LANES:
        return f"unknown lane {entry[1]}"
    if entry[2] < 0 or entry[3] < 0:
        return f"marker names record {entry[2]}:{entry[3]}"
    return None


def _marker(entry: Entry, text: bytes) -> Marker:
    kind = MarkerType(entry[0])
    words = text.decode("utf-8", "replace")
    return Marker(
        type=kind,
        lane=entry[1],
        partition=entry[2],
        offset=entry[3],
        attempt=entry[4],
        redeliver_after_ms=entry[5],
        max_attempts=entry[6],
        reason="" if kind is MarkerType.START else words,
        dead_letter_queue=words if kind is MarkerType.START else "",
    )


def decode_all(data: bytes | None) -> list[Marker]:
    """Every valid marker in a record, in order (invalid entries are left out). Raises
    :class:`kmq.MarkerDecodeError` for a record that is not a marker record at all."""
    if data is not None and data[:1] != b"\x02":
        from kmq.markers_v1 import decode_all_v1

        return decode_all_v1(data)
    entries, texts = parse(data)
    return [_marker(e, t) for e, t in zip(entries, texts, strict=True) if check_entry(e) is None]


def decode(data: bytes | None) -> Marker:
    """The one marker a record holds; raises :class:`kmq.MarkerDecodeError` unless the
    record holds exactly one valid marker."""
    if data is not None and data[:1] != b"\x02":
        from kmq.markers_v1 import decode_v1

        return decode_v1(data)
    entries, texts = parse(data)
    if len(entries) != 1:
        raise MarkerDecodeError(f"a batch of {len(entries)} markers: use decode_all()")
    problem = check_entry(entries[0])
    if problem is not None:
        raise MarkerDecodeError(problem)
    return _marker(entries[0], texts[0])
