"""Kafka records to Arrow record batches, column by column (only the columns asked for).

Each batch of records is turned into columns with one list comprehension per column: far
cheaper in Python than building rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError

from kmq._proto import marker_pb2
from kmq.errors import MarkerDecodeError
from kmq.markers import KNOWN_TYPES, PROTOCOL_VERSION, Entry, MarkerType, check_entry, parse
from kmq.records import ATTEMPT_HEADER, DLQ_ORIGIN_HEADER, ID_HEADER, parse_queue_headers

_MAX_INT32 = 2**31 - 1
_START = int(MarkerType.START)
_TS = pa.timestamp("ms", tz="UTC")


def marker_type_name(type_id: int, _cache: dict[int, str] = {}) -> str:  # noqa: B006
    """``START``, ``END``, ... or ``UNKNOWN_<n>`` for a type this build cannot name."""
    name = _cache.get(type_id)
    if name is None:
        if type_id in KNOWN_TYPES:  # REJECT and PROBE are version 2 types only
            name = MarkerType(type_id).name
        else:
            try:
                name = marker_pb2.MarkerType.Name(type_id)
            except ValueError:
                name = f"UNKNOWN_{type_id}"
        _cache[type_id] = name
    return name


class _Columns:
    """Collects values per column, then hands them over as one Arrow record batch."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.names: list[str] = list(schema.names)
        self.cols: dict[str, list[Any]] = {name: [] for name in self.names}
        self.rows = 0

    def flush(self) -> pa.RecordBatch:
        arrays = []
        for field in self.schema:
            values = self.cols[field.name]
            if pa.types.is_timestamp(field.type):
                arrays.append(pa.array(values, type=_TS).cast(field.type))
            else:
                arrays.append(pa.array(values, type=field.type))
            self.cols[field.name] = []
        self.rows = 0
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _ts(ts: int | None) -> int | None:
    return ts if ts is not None and ts >= 0 else None


def _kmq_headers(record: Any) -> tuple[str, int, Sequence[tuple[str, bytes]]]:
    """(message id, attempt, user headers) of a queue record, as kmq consumers see it."""
    h = record.headers
    # Fast path: the layout kmq writes, id and attempt first.
    if len(h) >= 2 and h[0][0] == ID_HEADER and h[1][0] == ATTEMPT_HEADER and h[0][1]:
        raw = h[1][1]
        if raw and raw.isdigit() and raw[0] != 48:  # b"0..." would need max(1, ...)
            user = h[2:]
            if all(k != ID_HEADER and k != ATTEMPT_HEADER and v is not None for k, v in user):
                return h[0][1].decode("utf-8", "replace"), int(raw), user
    message_id, attempt, parsed = parse_queue_headers(h)
    return message_id or f"ext-{record.partition}-{record.offset}", attempt, parsed


def _origin(user: Sequence[tuple[str, bytes]]) -> str | None:
    for name, value in user:
        if name == DLQ_ORIGIN_HEADER:
            return value.decode("utf-8", "replace")
    return None


class QueueColumns(_Columns):
    """Columns of queue-topic records, optionally only those of one logical queue."""

    def __init__(self, schema: pa.Schema, queue: str | None = None) -> None:
        super().__init__(schema)
        self._key = queue.encode() if queue is not None else None

    def extend(self, records: Sequence[Any]) -> None:
        if self._key is not None:
            key = self._key
            records = [r for r in records if r.key == key]
        c = self.cols
        want = set(self.names)
        self.rows += len(records)
        if want & {"message_id", "attempt", "headers", "dead_letter_origin"}:
            parsed = [_kmq_headers(r) for r in records]
            for i, name in enumerate(("message_id", "attempt", "headers")):
                if name in want:
                    c[name].extend([p[i] for p in parsed])
            if "dead_letter_origin" in want:
                c["dead_letter_origin"].extend([_origin(p[2]) if p[2] else None for p in parsed])
        if "partition" in want:
            c["partition"].extend([r.partition for r in records])
        if "offset" in want:
            c["offset"].extend([r.offset for r in records])
        if "timestamp" in want:
            c["timestamp"].extend([_ts(r.timestamp) for r in records])
        if "queue" in want:
            c["queue"].extend(
                [r.key.decode("utf-8", "replace") if r.key is not None else None for r in records]
            )
        if "payload" in want:
            c["payload"].extend([r.value for r in records])


def _marker_error(pb: Any) -> str | None:
    if pb.version != 1:
        return f"unsupported marker version {pb.version}"
    if pb.type == 0:
        return "marker type unspecified"
    if not pb.message_id:
        return "marker has no message id"
    if pb.partition < 0 or pb.offset < 0:
        return f"marker names record {pb.partition}:{pb.offset}"
    if pb.attempt > _MAX_INT32:
        return f"marker attempt {pb.attempt} out of range"
    return None


class _V2:
    """A version 2 marker entry, with the attribute names of the version 1 protobuf. It
    names its record by lane, partition and offset only: queue, message id, key, value and
    headers are null."""

    __slots__ = ("_entry", "_text")
    version = PROTOCOL_VERSION
    queue = None
    message_id = None
    key = None
    value = None
    headers = None

    def __init__(self, entry: Entry, text: bytes) -> None:
        self._entry = entry
        self._text = text

    @property
    def type(self) -> int:
        return self._entry[0]

    @property
    def lane(self) -> int:
        return self._entry[1]

    @property
    def partition(self) -> int:
        return self._entry[2]

    @property
    def offset(self) -> int:
        return self._entry[3]

    @property
    def attempt(self) -> int:
        return self._entry[4]

    @property
    def redeliver_after_ms(self) -> int:
        return self._entry[5]

    @property
    def max_attempts(self) -> int:
        return self._entry[6]

    @property
    def reason(self) -> str:
        return "" if self._entry[0] == _START else self._text.decode("utf-8", "replace")

    @property
    def dead_letter_queue(self) -> str:
        return self._text.decode("utf-8", "replace") if self._entry[0] == _START else ""


def _parse_marker(value: bytes | None) -> list[tuple[Any, str | None]]:
    """(marker view or None, error) per marker in a record: version 2 entries, or a version 1
    marker (one, or each entry of a BATCH record); a v1 marker of another version keeps its
    fields."""
    if value is None:
        return [(None, "marker record has no value")]
    if value[:1] == b"\x02":
        try:
            entries, texts = parse(value)
        except MarkerDecodeError as exc:
            return [(None, str(exc))]
        out: list[tuple[Any, str | None]] = []
        for entry, text in zip(entries, texts, strict=True):
            problem = check_entry(entry)
            out.append((_V2(entry, text) if problem is None else None, problem))
        return out
    pb = marker_pb2.Marker()
    try:
        pb.ParseFromString(value)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        return [(None, f"not a protobuf marker: {exc}")]
    if pb.type == marker_pb2.BATCH and pb.version == 1:
        return [_checked(entry) for entry in pb.batch]
    return [_checked(pb)]


def _checked(pb: Any) -> tuple[Any, str | None]:
    error = _marker_error(pb)
    return (pb if error is None or error.startswith("unsupported") else None), error


def _int32(value: int) -> int | None:
    return value if value <= _MAX_INT32 else None


def _headers(pb: Any) -> list[tuple[str, bytes]] | None:
    return None if pb.headers is None else [(h.key, h.value) for h in pb.headers]


_MARKER_FIELDS: dict[str, Callable[[Any], Any]] = {
    "type": lambda pb: marker_type_name(pb.type),
    "type_id": lambda pb: int(pb.type),
    "version": lambda pb: _int32(pb.version),
    "queue": lambda pb: pb.queue,
    "partition": lambda pb: pb.partition,
    "offset": lambda pb: pb.offset,
    "message_id": lambda pb: pb.message_id,
    "attempt": lambda pb: _int32(pb.attempt),
    "redeliver_after_ms": lambda pb: pb.redeliver_after_ms,
    "key": lambda pb: pb.key,
    "value": lambda pb: pb.value,
    "headers": _headers,
    "lane": lambda pb: getattr(pb, "lane", 0),
    "reason": lambda pb: pb.reason,
    "max_attempts": lambda pb: _int32(pb.max_attempts),
    "dead_letter_queue": lambda pb: pb.dead_letter_queue,
}


class MarkerColumns(_Columns):
    """Columns of markers-topic records; undecodable ones keep only ``error`` and position."""

    def __init__(self, schema: pa.Schema, queue: str | None = None) -> None:
        super().__init__(schema)
        self._queue = queue

    def extend(self, records: Sequence[Any]) -> None:
        # A BATCH record becomes one row per marker, all at the record's partition and offset.
        flat = [(r, p) for r in records for p in _parse_marker(r.value)]
        records = [r for r, _ in flat]
        parsed = [p for _, p in flat]
        if self._queue is not None:
            # Version 2 markers name no queue: they are kept (join them with the queue
            # records to tell); version 1 markers of other queues are left out.
            q = self._queue
            keep = [bool(p[0]) and p[0].queue in (q, None) for p in parsed]
            records = [r for r, k in zip(records, keep, strict=True) if k]
            parsed = [p for p, k in zip(parsed, keep, strict=True) if k]
        c = self.cols
        self.rows += len(records)
        for name in self.names:
            column = c[name]
            if name == "marker_partition":
                column.extend([r.partition for r in records])
            elif name == "marker_offset":
                column.extend([r.offset for r in records])
            elif name == "timestamp":
                column.extend([_ts(r.timestamp) for r in records])
            elif name == "error":
                column.extend([p[1] for p in parsed])
            elif name == "type":  # the commonest lookup, inlined
                column.extend([marker_type_name(p[0].type) if p[0] else None for p in parsed])
            else:
                get = _MARKER_FIELDS[name]
                column.extend([get(p[0]) if p[0] else None for p in parsed])
