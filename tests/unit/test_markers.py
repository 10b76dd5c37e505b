"""The marker codec: version 2 (fixed-size binary) round trips, pinned wire formats of both
versions, robust decoding, and version 1 (protobuf) markers staying readable."""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import kmq
from kmq._proto import marker_pb2
from kmq.markers import (
    ENTRY,
    ENTRY_BYTES,
    HEADER_BYTES,
    LANES,
    MAX_AFTER_MS,
    MAX_ATTEMPT,
    MAX_TEXT_BYTES,
    PROTOCOL_VERSION,
    QUEUE_LANE,
    RETRY_LANE,
    Entry,
    Marker,
    MarkerType,
    check_entry,
    decode,
    decode_all,
    encode,
    encode_batch,
    encode_entries,
    parse,
)
from kmq.markers_v1 import encode_batch_v1, encode_v1

SETTINGS = settings(max_examples=200, deadline=None)

# -- version 2: the pinned wire format --------------------------------------------------------

GOLDEN_V2 = [
    Marker(
        MarkerType.START,
        partition=3,
        offset=123_456_789,
        attempt=2,
        redeliver_after_ms=30_000,
        max_attempts=5,
        dead_letter_queue="orders.dlq",
    ),
    Marker(
        MarkerType.NACK,
        partition=7,
        offset=2**40 + 1,
        attempt=4_000_000_000,
        redeliver_after_ms=1500,
        reason="golden ☃",
        lane=RETRY_LANE,
    ),
]
# Computed once from GOLDEN_V2. If these fail, the version 2 wire format changed: markers
# already on the markers topic would no longer decode the same way.
GOLDEN_V2_HEX = (
    "020000000101000000000300000000075bcd15000000020000753000000005000a6f72646572732e646c71"
)
GOLDEN_V2_BATCH_HEX = (
    "02"  # version
    "00000002"  # count
    "01" "00" "00000003" "00000000075bcd15" "00000002" "00007530" "00000005" "000a"
    "04" "01" "00000007" "0000010000000001" "ee6b2800" "000005dc" "00000000" "000a"
    "6f72646572732e646c71"  # orders.dlq
    "676f6c64656e20e29883"  # golden ☃
)  # fmt: skip


def test_golden_v2_encode() -> None:
    assert encode(GOLDEN_V2[0]).hex() == GOLDEN_V2_HEX
    assert encode_batch(GOLDEN_V2).hex() == GOLDEN_V2_BATCH_HEX


def test_golden_v2_decode() -> None:
    assert decode(bytes.fromhex(GOLDEN_V2_HEX)) == GOLDEN_V2[0]
    assert decode_all(bytes.fromhex(GOLDEN_V2_BATCH_HEX)) == GOLDEN_V2


def test_format_constants() -> None:
    assert PROTOCOL_VERSION == 2
    assert (HEADER_BYTES, ENTRY_BYTES) == (5, 28)
    assert ENTRY.format == ">BBiqIIIH"
    assert LANES == (QUEUE_LANE, RETRY_LANE) == (0, 1)


# -- version 1: old markers stay readable -----------------------------------------------------

# A version 1 START as kmq 0.1 wrote it (the old GOLDEN_HEX, payload included).
GOLDEN_V1_HEX = (
    "080110011a066f7264657273200328959aef3a3220303132333435363738396162636465663031323334"
    "35363738396162636465663802"
    "40b0ea014a066f72646572735209007061796c6f6164ff5a0f0a0874726163652d696412036162635a07"
    "0a05656d7074796206676f6c64656e"
)
GOLDEN_V1 = Marker(
    type=MarkerType.START,
    partition=3,
    offset=123_456_789,
    attempt=2,
    redeliver_after_ms=30_000,
    reason="golden",
    version=1,
    queue="orders",
    message_id="0123456789abcdef0123456789abcdef",
)


def test_golden_v1_still_decodes() -> None:
    data = bytes.fromhex(GOLDEN_V1_HEX)
    assert decode(data) == GOLDEN_V1
    assert decode_all(data) == [GOLDEN_V1]
    # The payload it carries is ignored: the entry names the record, like a version 2 one.
    assert parse(data) == ([(1, QUEUE_LANE, 3, 123_456_789, 2, 30_000, 0, 0)], [b""])


def test_encode_v1_rebuilds_the_golden_bytes() -> None:
    data = encode_v1(
        type=MarkerType.START,
        queue="orders",
        partition=3,
        offset=123_456_789,
        message_id="0123456789abcdef0123456789abcdef",
        attempt=2,
        redeliver_after_ms=30_000,
        key=b"orders",
        value=b"\x00payload\xff",
        headers=[("trace-id", b"abc"), ("empty", b"")],
        reason="golden",
    )
    assert data.hex() == GOLDEN_V1_HEX


V2_ONLY = {MarkerType.REJECT, MarkerType.PROBE, MarkerType.WATCH}
"""Types version 1 never had (its 8 was BATCH, a container record)."""


def test_marker_types_match_the_proto_enum() -> None:
    proto_names = set(marker_pb2.MarkerType.keys()) - {"MARKER_TYPE_UNSPECIFIED", "BATCH"}
    assert {t.name for t in MarkerType if t not in V2_ONLY} == proto_names
    for t in MarkerType:
        if t not in V2_ONLY:
            assert int(t) == marker_pb2.MarkerType.Value(t.name)


@pytest.mark.parametrize("kind", sorted(V2_ONLY))
def test_version_1_never_reads_a_version_2_only_type(kind: MarkerType) -> None:
    # Version 1's 8 is an (here empty) BATCH record; 9 it never had.
    value = encode_v1(type=kind, partition=0, offset=0, message_id="m", attempt=1)
    with pytest.raises(kmq.MarkerDecodeError):
        decode(value)


V1_CASES: dict[str, tuple[dict[str, Any], Entry, bytes]] = {
    "start-with-dlq": (
        {"type": MarkerType.START, "partition": 1, "offset": 2, "message_id": "m", "attempt": 3,
         "redeliver_after_ms": 400, "max_attempts": 5, "dead_letter_queue": "d", "reason": "x"},
        (1, 0, 1, 2, 3, 400, 5, 1),
        b"d",
    ),
    "nack-reason": (
        {"type": MarkerType.NACK, "partition": 0, "offset": 9, "message_id": "m",
         "redeliver_after_ms": 5, "reason": "boom"},
        (4, 0, 0, 9, 0, 5, 0, 4),
        b"boom",
    ),
    "negative-after-clamped-to-0": (
        {"type": MarkerType.NACK, "partition": 0, "offset": 9, "message_id": "m",
         "redeliver_after_ms": -5},
        (4, 0, 0, 9, 0, 0, 0, 0),
        b"",
    ),
    "huge-after-clamped-to-uint32": (
        {"type": MarkerType.KEEPALIVE, "partition": 0, "offset": 9, "message_id": "m",
         "redeliver_after_ms": 2**63 - 1},
        (2, 0, 0, 9, 0, MAX_AFTER_MS, 0, 0),
        b"",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("fields", "entry", "text"), V1_CASES.values(), ids=V1_CASES.keys())
def test_v1_entries(fields: dict[str, Any], entry: Entry, text: bytes) -> None:
    assert parse(encode_v1(**fields)) == ([entry], [text])


def test_v1_batch_keeps_order_and_drops_invalid_entries() -> None:
    good: list[dict[str, Any]] = [
        {"type": MarkerType.START, "queue": "q", "partition": 0, "offset": 1, "message_id": "a",
         "attempt": 1, "redeliver_after_ms": 1000, "value": b"x"},
        {"type": MarkerType.KEEPALIVE, "queue": "q", "partition": 0, "offset": 1,
         "message_id": "a", "attempt": 1, "redeliver_after_ms": 1000},
        {"type": MarkerType.END, "queue": "q", "partition": 0, "offset": 2, "message_id": "b",
         "attempt": 3},
    ]  # fmt: skip
    bad: list[dict[str, Any]] = [
        {"type": marker_pb2.BATCH, "message_id": "nested"},
        {"type": MarkerType.END, "message_id": ""},
        {"type": MarkerType.END, "message_id": "c", "partition": -1},
    ]
    data = encode_batch_v1([good[0], *bad, good[1], good[2]])
    decoded = decode_all(data)
    assert [(m.type, m.message_id, m.offset, m.version) for m in decoded] == [
        (MarkerType.START, "a", 1, 1),
        (MarkerType.KEEPALIVE, "a", 1, 1),
        (MarkerType.END, "b", 2, 1),
    ]
    entries, texts = parse(data)
    assert len(entries) == len(texts) == 6
    assert [check_entry(e) is None for e in entries] == [True, False, False, False, True, True]
    with pytest.raises(kmq.MarkerDecodeError, match="decode_all"):
        decode(data)


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"version": 0}, "version 0"),
        ({"version": 2}, "version 2"),
        ({"type": marker_pb2.MARKER_TYPE_UNSPECIFIED}, "type"),
        ({"type": 99}, "type 99"),
        ({"message_id": ""}, "message id"),
        ({"partition": -1}, "-1:0"),
        ({"offset": -1}, "0:-1"),
    ],
)
def test_v1_decode_rejects_invalid_markers(fields: dict[str, object], complaint: str) -> None:
    base = {"type": MarkerType.START, "partition": 0, "offset": 0, "message_id": "m"}
    assert decode(encode_v1(**base)).message_id == "m", "the base marker is valid"
    with pytest.raises(kmq.MarkerDecodeError, match=complaint):
        decode(encode_v1(**{**base, **fields}))


@pytest.mark.parametrize("data", [b"", b"\xff", b"\x0a\x05ab", b"\x08\x01\x10"])
def test_v1_decode_rejects_non_markers(data: bytes) -> None:
    with pytest.raises(kmq.MarkerDecodeError):
        decode(data)
    with pytest.raises(kmq.MarkerDecodeError):
        parse(data)


v1_markers: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "type": st.sampled_from([t for t in MarkerType if t not in V2_ONLY]),
        "partition": st.integers(0, 2**31 - 1),
        "offset": st.integers(0, 2**63 - 1),
        "message_id": st.text(min_size=1, max_size=40),
        "attempt": st.integers(0, MAX_ATTEMPT),
        "redeliver_after_ms": st.integers(0, MAX_AFTER_MS),
        "max_attempts": st.integers(0, MAX_ATTEMPT),
        "reason": st.text(max_size=20),
        "dead_letter_queue": st.text(max_size=20),
        "value": st.binary(max_size=20),
    }
)


@SETTINGS
@given(v1_markers)
def test_a_v1_marker_reads_as_the_same_v2_marker(fields: dict[str, Any]) -> None:
    """The upgrade path: a version 1 marker parses to the entry its version 2 twin packs."""
    start = fields["type"] is MarkerType.START
    twin = Marker(
        type=fields["type"],
        partition=fields["partition"],
        offset=fields["offset"],
        attempt=fields["attempt"],
        redeliver_after_ms=fields["redeliver_after_ms"],
        max_attempts=fields["max_attempts"],
        reason="" if start else fields["reason"],
        dead_letter_queue=fields["dead_letter_queue"] if start else "",
    )
    assert parse(encode_v1(**fields)) == parse(encode(twin))
    old = decode(encode_v1(**fields))
    assert (old.version, old.message_id, old.delivery) == (
        1,
        fields["message_id"],
        (fields["partition"], fields["offset"]),
    )


# -- version 2: round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("marker_type", list(MarkerType))
@pytest.mark.parametrize("lane", LANES)
def test_round_trip_every_type_and_lane(marker_type: MarkerType, lane: int) -> None:
    start = marker_type is MarkerType.START
    marker = dataclasses.replace(
        GOLDEN_V2[1],
        type=marker_type,
        lane=lane,
        reason="" if start else "why",
        dead_letter_queue="dlq" if start else "",
    )
    data = encode(marker)
    decoded = decode(data)
    assert decoded == marker
    assert decoded.type is marker_type
    assert decoded.delivery == (marker.partition, marker.offset)
    assert decoded.text == ("dlq" if start else "why")
    assert len(data) == HEADER_BYTES + ENTRY_BYTES + 3


def test_a_starts_reason_and_anothers_dead_letter_queue_are_not_written() -> None:
    start = Marker(MarkerType.START, 1, 2, reason="not kept", dead_letter_queue="kept")
    end = Marker(MarkerType.END, 1, 2, reason="kept", dead_letter_queue="not kept")
    assert decode(encode(start)) == dataclasses.replace(start, reason="")
    assert decode(encode(end)) == dataclasses.replace(end, dead_letter_queue="")


texts = st.text(max_size=30)


@st.composite
def v2_markers(draw: st.DrawFn) -> Marker:
    kind = draw(st.sampled_from(MarkerType))
    text = draw(texts)
    start = kind is MarkerType.START
    return Marker(
        type=kind,
        partition=draw(st.integers(0, 2**31 - 1)),
        offset=draw(st.integers(0, 2**63 - 1)),
        attempt=draw(st.integers(0, MAX_ATTEMPT)),
        redeliver_after_ms=draw(st.integers(0, MAX_AFTER_MS)),
        max_attempts=draw(st.integers(0, MAX_ATTEMPT)),
        reason="" if start else text,
        dead_letter_queue=text if start else "",
        lane=draw(st.sampled_from(LANES)),
    )


@SETTINGS
@given(v2_markers())
def test_round_trip_any_marker(marker: Marker) -> None:
    data = encode(marker)
    assert decode(data) == marker
    assert len(data) == HEADER_BYTES + ENTRY_BYTES + len(marker.text.encode())


@SETTINGS
@given(st.lists(v2_markers(), min_size=1, max_size=20))
def test_batch_round_trip_keeps_order(markers: list[Marker]) -> None:
    data = encode_batch(markers)
    assert decode_all(data) == markers
    pairs = [m.entry() for m in markers]
    entries = [e for e, _ in pairs]
    assert encode_entries(entries, [t for _, t in pairs if t]) == data
    assert parse(data) == (entries, [t for _, t in pairs])
    if len(markers) > 1:
        with pytest.raises(kmq.MarkerDecodeError, match="decode_all"):
            decode(data)


@SETTINGS
@given(st.lists(v2_markers(), min_size=1, max_size=5), st.data())
@example(markers=[Marker(MarkerType.NACK, 1, 2, reason="boom")], data=None)
def test_every_strict_prefix_of_a_record_is_refused(
    markers: list[Marker], data: st.DataObject | None
) -> None:
    record = encode_batch(markers)
    cuts = range(len(record)) if data is None else [data.draw(st.integers(0, len(record) - 1))]
    for cut in cuts:
        with pytest.raises(kmq.MarkerDecodeError):
            parse(record[:cut])


def test_a_record_cut_right_after_its_entries_is_refused() -> None:
    # Before the fix, a record whose texts were cut off parsed as markers without texts.
    record = encode(Marker(MarkerType.NACK, 1, 2, reason="boom"))
    with pytest.raises(kmq.MarkerDecodeError, match="texts"):
        parse(record[: HEADER_BYTES + ENTRY_BYTES])


@SETTINGS
@given(st.lists(v2_markers(), min_size=1, max_size=5), st.binary(min_size=1, max_size=10))
def test_trailing_bytes_are_refused(markers: list[Marker], junk: bytes) -> None:
    with pytest.raises(kmq.MarkerDecodeError, match="texts"):
        parse(encode_batch(markers) + junk)


# -- version 2: what the codec refuses ---------------------------------------------------------


def entry_bytes(*fields: int) -> bytes:
    return ENTRY.pack(*fields)


GOOD_ENTRY = (int(MarkerType.END), QUEUE_LANE, 1, 2, 1, 0, 0, 0)

BAD_RECORDS: dict[str, tuple[bytes | None, str]] = {
    "no-value": (None, "no value"),
    "version-only": (b"\x02", "too short"),
    "short-header": (b"\x02\x00\x00\x00", "too short"),
    "count-zero": (b"\x02" + struct.pack(">I", 0), "cannot hold 0 markers"),
    "count-too-big": (b"\x02" + struct.pack(">I", 2) + entry_bytes(*GOOD_ENTRY), "cannot hold 2"),
    "count-huge": (b"\x02" + struct.pack(">I", 2**32 - 1) + entry_bytes(*GOOD_ENTRY), "cannot"),
    "truncated-entry": (b"\x02" + struct.pack(">I", 1) + entry_bytes(*GOOD_ENTRY)[:-1], "cannot"),
    "text-missing": (
        b"\x02" + struct.pack(">I", 1) + entry_bytes(*GOOD_ENTRY[:7], 4),
        "texts",
    ),
    "text-too-short": (
        b"\x02" + struct.pack(">I", 1) + entry_bytes(*GOOD_ENTRY[:7], 4) + b"abc",
        "texts",
    ),
    "text-too-long": (
        b"\x02" + struct.pack(">I", 1) + entry_bytes(*GOOD_ENTRY[:7], 2) + b"abc",
        "texts",
    ),
    "wrong-version-byte": (b"\x03" + encode(Marker(MarkerType.END, 1, 2))[1:], "protobuf"),
    "version-0": (b"\x00" + encode(Marker(MarkerType.END, 1, 2))[1:], "protobuf"),
}


@pytest.mark.parametrize(("data", "complaint"), BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_bad_records_are_refused_whole(data: bytes | None, complaint: str) -> None:
    for read in (parse, decode, decode_all):
        with pytest.raises(kmq.MarkerDecodeError, match=complaint):
            read(data)


BAD_ENTRIES: dict[str, tuple[Entry, str]] = {
    "type-0": ((0, 0, 1, 2, 1, 0, 0, 0), "unknown marker type 0"),
    "type-11": ((11, 0, 1, 2, 1, 0, 0, 0), "unknown marker type 11"),
    "type-255": ((255, 0, 1, 2, 1, 0, 0, 0), "unknown marker type 255"),
    "lane-2": ((3, 2, 1, 2, 1, 0, 0, 0), "unknown lane 2"),
    "lane-255": ((3, 255, 1, 2, 1, 0, 0, 0), "unknown lane 255"),
    "negative-partition": ((3, 0, -1, 2, 1, 0, 0, 0), "-1:2"),
    "negative-offset": ((3, 0, 1, -2, 1, 0, 0, 0), "1:-2"),
}


@pytest.mark.parametrize(("entry", "complaint"), BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_bad_entries_are_left_out(entry: Entry, complaint: str) -> None:
    problem = check_entry(entry)
    assert problem is not None and complaint in problem
    alone = encode_entries([entry], [])
    with pytest.raises(kmq.MarkerDecodeError, match=complaint):
        decode(alone)
    assert decode_all(alone) == []
    good = Marker(MarkerType.KEEPALIVE, 5, 6, redeliver_after_ms=9)
    mixed = encode_entries([good.entry()[0], entry, good.entry()[0]], [])
    assert decode_all(mixed) == [good, good]
    assert parse(mixed)[0][1] == entry, "parse hands entries back unchecked"


def test_check_entry_accepts_every_valid_type_and_lane() -> None:
    for kind in MarkerType:
        for lane in LANES:
            assert check_entry((int(kind), lane, 0, 0, 0, 0, 0, 0)) is None


UNENCODABLE: dict[str, tuple[dict[str, Any], str]] = {
    "lane-2": ({"lane": 2}, "lane"),
    "attempt-negative": ({"attempt": -1}, "attempt"),
    "attempt-over-uint32": ({"attempt": MAX_ATTEMPT + 1}, "attempt"),
    "after-negative": ({"redeliver_after_ms": -1}, "redeliver_after_ms"),
    "after-over-uint32": ({"redeliver_after_ms": MAX_AFTER_MS + 1}, "redeliver_after_ms"),
    "max-attempts-over-uint32": ({"max_attempts": MAX_ATTEMPT + 1}, "max_attempts"),
    "reason-too-long": ({"reason": "é" * (MAX_TEXT_BYTES // 2 + 1)}, "text"),
}


@pytest.mark.parametrize(("fields", "complaint"), UNENCODABLE.values(), ids=UNENCODABLE.keys())
def test_encode_refuses_what_does_not_fit(fields: dict[str, Any], complaint: str) -> None:
    marker = Marker(MarkerType.NACK, 1, 2)
    assert decode(encode(marker)) == marker
    with pytest.raises(ValueError, match=complaint):
        encode(dataclasses.replace(marker, **fields))
    with pytest.raises(ValueError, match=complaint):
        encode_batch([marker, dataclasses.replace(marker, **fields)])


def test_longest_text_fits() -> None:
    marker = Marker(MarkerType.NACK, 1, 2, reason="r" * MAX_TEXT_BYTES)
    assert decode(encode(marker)) == marker


def test_invalid_utf8_text_is_replaced_not_raised() -> None:
    entry = (int(MarkerType.NACK), QUEUE_LANE, 1, 2, 1, 0, 0, 2)
    assert decode(encode_entries([entry], [b"\xff\xfe"])).reason == "\ufffd\ufffd"


@SETTINGS
@given(st.binary(max_size=300))
@example(b"\x02\x00\x00\x00\x01" + bytes(28))
def test_decode_random_bytes_returns_markers_or_raises_marker_decode_error(data: bytes) -> None:
    try:
        markers = decode_all(data)
    except kmq.MarkerDecodeError:
        return
    for marker in markers:
        assert isinstance(marker, Marker)
        assert marker.lane in LANES
        assert marker.partition >= 0 and marker.offset >= 0
        if marker.version == 1:
            assert marker.message_id


@SETTINGS
@given(st.lists(v2_markers(), min_size=1, max_size=3), st.binary(max_size=20), st.integers(0, 400))
def test_decode_corrupted_marker_never_raises_anything_else(
    markers: list[Marker], junk: bytes, cut: int
) -> None:
    data = encode_batch(markers)
    for mutated in (data[:cut], data[:cut] + junk + data[cut:], junk + data):
        with contextlib.suppress(kmq.MarkerDecodeError):
            assert all(isinstance(m, Marker) for m in decode_all(mutated))
        with contextlib.suppress(kmq.MarkerDecodeError):
            assert isinstance(decode(mutated), Marker)


def test_marker_decode_error_is_a_kmq_error() -> None:
    assert issubclass(kmq.MarkerDecodeError, kmq.KmqError)
