"""Kafka records to Arrow record batches, column by column (only the columns asked for).

Each batch of records is turned into columns with one list comprehension per column: far
cheaper in Python than building rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError

from kmq._proto import marker_pb2
from kmq.errors import MarkerDecodeError
from kmq.markers import (
    ENTRY_BYTES,
    HEADER_BYTES,
    KNOWN_TYPES,
    LANES,
    MAX_ATTEMPT,
    PROTOCOL_VERSION,
    Entry,
    MarkerType,
    check_entry,
    parse,
)
from kmq.records import ATTEMPT_HEADER, DLQ_ORIGIN_HEADER, ID_HEADER, parse_queue_headers
from kmq.spark.kafka_io import RecordRun

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
    """Collects record batches of the schema's columns; ``flush`` hands them over as one."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.names: list[str] = list(schema.names)
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0

    def _add(self, columns: dict[str, Any], rows: int) -> None:
        """Add ``rows`` rows: per column name, a list of Python values or an Arrow array."""
        arrays = []
        for field in self.schema:
            values = columns[field.name]
            if isinstance(values, pa.Array):
                arrays.append(values)
            elif pa.types.is_timestamp(field.type):
                arrays.append(pa.array(values, type=_TS).cast(field.type))
            else:
                arrays.append(pa.array(values, type=field.type))
        self.batches.append(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
        self.rows += rows

    def flush(self) -> pa.RecordBatch:
        batches, self.batches, self.rows = self.batches, [], 0
        if len(batches) == 1:
            return batches[0]
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=self.schema)
        return pa.concat_batches(batches)


def _ts(ts: int | None) -> int | None:
    return ts if ts is not None and ts >= 0 else None


def _kmq_headers(
    h: Any, partition: int, offset: int
) -> tuple[str, int | None, Sequence[tuple[str, bytes]]]:
    """(message id, attempt, user headers) of a queue record (its headers, partition and
    offset), as kmq consumers see it; an attempt past the int32 column is null, as in the
    markers' columns."""
    # Fast paths: the layouts kmq writes, the id alone (attempt 1), or id and attempt first.
    if len(h) == 1 and h[0][0] == ID_HEADER and h[0][1]:
        return h[0][1].decode("utf-8", "replace"), 1, ()
    if len(h) >= 2 and h[0][0] == ID_HEADER and h[1][0] == ATTEMPT_HEADER and h[0][1]:
        raw = h[1][1]
        if raw and raw.isdigit() and raw[0] != 48:  # b"0..." would need max(1, ...)
            user = h[2:]
            if all(k != ID_HEADER and k != ATTEMPT_HEADER and v is not None for k, v in user):
                return h[0][1].decode("utf-8", "replace"), _int32(min(int(raw), MAX_ATTEMPT)), user
    message_id, attempt, parsed = parse_queue_headers(h)
    return message_id or f"ext-{partition}-{offset}", _int32(attempt), parsed


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
        """Add kafka-python-like records."""
        self.extend_run(RecordRun.of(records))

    def extend_run(self, run: RecordRun) -> None:
        parts, offsets, stamps, keys = run.partitions, run.offsets, run.timestamps, run.keys
        values, heads = run.values, run.headers
        if self._key is not None:
            key = self._key
            keep = [i for i, k in enumerate(keys) if k == key]
            parts, offsets, stamps = (
                [parts[i] for i in keep],
                [offsets[i] for i in keep],
                [stamps[i] for i in keep],
            )
            keys, values = [keys[i] for i in keep], [values[i] for i in keep]
            heads = [heads[i] for i in keep] if heads is not None else None
        want = set(self.names)
        c: dict[str, Any] = {}
        if want & {"message_id", "attempt", "headers", "dead_letter_origin"}:
            assert heads is not None, "read with headers for these columns"
            parsed = [_kmq_headers(h, p, o) for h, p, o in zip(heads, parts, offsets, strict=True)]
            for i, name in enumerate(("message_id", "attempt", "headers")):
                if name in want:
                    c[name] = [p[i] for p in parsed]
            if "dead_letter_origin" in want:
                c["dead_letter_origin"] = [_origin(p[2]) if p[2] else None for p in parsed]
        if "partition" in want:
            c["partition"] = parts
        if "offset" in want:
            c["offset"] = offsets
        if "timestamp" in want:
            c["timestamp"] = [_ts(t) for t in stamps]
        if "queue" in want:
            c["queue"] = [k.decode("utf-8", "replace") if k is not None else None for k in keys]
        if "payload" in want:
            c["payload"] = values
        self._add(c, len(offsets))


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


_ENTRY_DTYPE = np.dtype(
    [("type", "u1"), ("lane", "u1"), ("partition", ">i4"), ("offset", ">i8"), ("attempt", ">u4"),
     ("redeliver_after_ms", ">u4"), ("max_attempts", ">u4"), ("text", ">u2")]
)  # fmt: skip
"""kmq.markers.ENTRY as a numpy record: version 2 markers decode a column at a time."""
assert _ENTRY_DTYPE.itemsize == ENTRY_BYTES
_TYPE_NAMES = pa.array([marker_type_name(t) for t in range(256)], type=pa.string())
_KNOWN = np.array(sorted(KNOWN_TYPES), dtype=np.uint8)
_V2_PREFIX = b"\x02"


class MarkerColumns(_Columns):
    """Columns of markers-topic records; undecodable ones keep only ``error`` and position.

    Version 2 records are decoded a column at a time (numpy over their fixed-size entries);
    version 1 (protobuf) and undecodable records a record at a time, in record order."""

    def __init__(self, schema: pa.Schema, queue: str | None = None) -> None:
        super().__init__(schema)
        self._queue = queue

    def extend(self, records: Sequence[Any]) -> None:
        """Add kafka-python-like records."""
        self.extend_run(RecordRun.of(records))

    def extend_run(self, run: RecordRun) -> None:
        # Sort the records: version 2 ones (entries, counts, texts) and the others.
        fast: list[int] = []
        counts: list[int] = []
        chunks: list[bytes] = []
        texts: dict[int, list[bytes]] = {}  # position in fast -> each entry's text
        slow: list[int] = []
        for i, v in enumerate(run.values):
            if v is not None and v[:1] == _V2_PREFIX and len(v) >= HEADER_BYTES:
                n = int.from_bytes(v[1:HEADER_BYTES], "big")
                end = HEADER_BYTES + n * ENTRY_BYTES
                if n and end == len(v):
                    fast.append(i)
                    counts.append(n)
                    chunks.append(v[HEADER_BYTES:])
                    continue
                if n and end < len(v):
                    try:
                        _, entry_texts = parse(v)
                    except MarkerDecodeError:
                        slow.append(i)
                        continue
                    texts[len(fast)] = entry_texts
                    fast.append(i)
                    counts.append(n)
                    chunks.append(v[HEADER_BYTES:end])
                    continue
            slow.append(i)
        if not slow:
            batch = self._v2_batch(run, fast, counts, chunks, texts)[0]
        elif not fast:
            batch = self._slow_batch(run, slow)[0]
        else:  # both kinds: back into record order
            v2, v2_records = self._v2_batch(run, fast, counts, chunks, texts)
            other, other_records = self._slow_batch(run, slow)
            order = np.argsort(np.concatenate([v2_records, other_records]), kind="stable")
            batch = pa.concat_batches([v2, other]).take(pa.array(order))
        self.batches.append(batch)
        self.rows += batch.num_rows

    def _v2_batch(
        self,
        run: RecordRun,
        fast: list[int],
        counts: list[int],
        chunks: list[bytes],
        texts: dict[int, list[bytes]],
    ) -> tuple[pa.RecordBatch, Any]:
        """The rows of version 2 records ``fast`` (positions in ``run``), with ``counts``
        entries each (``chunks``: their entry bytes; ``texts``: by position in ``fast``, each
        entry's text, for records that have texts), and each row's record position."""
        e = np.frombuffer(b"".join(chunks), dtype=_ENTRY_DTYPE)
        records = np.repeat(np.asarray(fast, dtype=np.int64), counts)
        entry_texts: list[bytes] | None = None
        if texts:
            entry_texts = []
            for k, n in enumerate(counts):
                entry_texts.extend(texts.get(k) or [b""] * n)
        valid = (
            np.isin(e["type"], _KNOWN)
            & np.isin(e["lane"], LANES)
            & (e["partition"] >= 0)
            & (e["offset"] >= 0)
        )
        all_valid = bool(valid.all())
        if self._queue is not None and not all_valid:
            # A queue filter keeps version 2 markers (they name no queue), the valid ones.
            e, records = e[valid], records[valid]
            if entry_texts is not None:
                entry_texts = [t for t, k in zip(entry_texts, valid.tolist(), strict=True) if k]
            valid, all_valid = np.ones(len(e), dtype=bool), True
        n = len(e)
        null = None if all_valid else ~valid
        types = e["type"]
        c: dict[str, Any] = {}
        for name in self.names:
            if name == "marker_partition":
                c[name] = pa.array(np.asarray(run.partitions, dtype=np.int32)[records])
            elif name == "marker_offset":
                c[name] = pa.array(np.asarray(run.offsets, dtype=np.int64)[records])
            elif name == "timestamp":
                stamps = [t if t is not None else -1 for t in run.timestamps]
                ts = np.asarray(stamps, dtype=np.int64)[records]
                c[name] = pa.array(ts, type=_TS, mask=ts < 0).cast(self.schema.field(name).type)
            elif name == "type":
                c[name] = _TYPE_NAMES.take(pa.array(types, mask=null))
            elif name == "type_id":
                c[name] = pa.array(types.astype(np.int32), mask=null)
            elif name == "version":
                c[name] = pa.array(np.full(n, PROTOCOL_VERSION, dtype=np.int32), mask=null)
            elif name in ("lane", "partition"):
                c[name] = pa.array(e[name].astype(np.int32), mask=null)
            elif name in ("offset", "redeliver_after_ms"):
                c[name] = pa.array(e[name].astype(np.int64), mask=null)
            elif name in ("attempt", "max_attempts"):
                raw = e[name].astype(np.int64)
                big = raw > _MAX_INT32  # a uint32 past the int32 column: null, as _int32 does
                mask = big if null is None else (big | null)
                c[name] = pa.array(np.where(big, 0, raw).astype(np.int32), mask=mask)
            elif name in ("reason", "dead_letter_queue"):
                c[name] = _text_column(name, types, entry_texts, null, n)
            elif name == "error":
                if null is None:
                    c[name] = pa.nulls(n, type=pa.string())
                else:
                    c[name] = pa.array(
                        [check_entry(_entry(row)) if bad else None
                         for row, bad in zip(e.tolist(), null.tolist(), strict=True)],
                        type=pa.string(),
                    )  # fmt: skip
            else:  # queue, message_id, key, value, headers: not in version 2 markers
                c[name] = pa.nulls(n, type=self.schema.field(name).type)
        arrays = [c[f.name] for f in self.schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema), records

    def _slow_batch(self, run: RecordRun, which: list[int]) -> tuple[pa.RecordBatch, Any]:
        """Records one at a time (version 1 markers, undecodable records); a BATCH record
        becomes one row per marker, all at the record's partition and offset."""
        flat = [(i, p) for i in which for p in _parse_marker(run.values[i])]
        if self._queue is not None:
            # Version 2 markers name no queue: they are kept (join them with the queue
            # records to tell); version 1 markers of other queues are left out.
            q = self._queue
            flat = [(i, p) for i, p in flat if bool(p[0]) and p[0].queue in (q, None)]
        rows = [i for i, _ in flat]
        parsed = [p for _, p in flat]
        c: dict[str, Any] = {}
        for name in self.names:
            if name == "marker_partition":
                c[name] = [run.partitions[i] for i in rows]
            elif name == "marker_offset":
                c[name] = [run.offsets[i] for i in rows]
            elif name == "timestamp":
                c[name] = [_ts(run.timestamps[i]) for i in rows]
            elif name == "error":
                c[name] = [p[1] for p in parsed]
            else:
                get = _MARKER_FIELDS[name]
                c[name] = [get(p[0]) if p[0] else None for p in parsed]
        arrays = []
        for field in self.schema:
            values = c[field.name]
            if pa.types.is_timestamp(field.type):
                arrays.append(pa.array(values, type=_TS).cast(field.type))
            else:
                arrays.append(pa.array(values, type=field.type))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        return batch, np.asarray(rows, dtype=np.int64)


def _text_column(name: str, types: Any, texts: list[bytes] | None, null: Any, n: int) -> pa.Array:
    """``reason`` or ``dead_letter_queue`` of version 2 markers: a START's text is its
    dead-letter queue, another type's its reason; the other column is empty."""
    if texts is None:
        empty = pa.array(np.full(n, "", dtype=object), type=pa.string())
        return empty if null is None else pc.if_else(pa.array(null), None, empty)
    starts = (types == _START).tolist()
    mine = starts if name == "dead_letter_queue" else [not s for s in starts]
    return pa.array(
        [t.decode("utf-8", "replace") if m else "" for t, m in zip(texts, mine, strict=True)],
        type=pa.string(),
        mask=null,
    )


def _entry(row: tuple[int, ...]) -> Entry:
    return (row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])
