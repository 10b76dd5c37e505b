"""The pause table and its wire format, and the CLI's --until parsing."""

from __future__ import annotations

import datetime

import click
import pytest

from kmq.cli.pause import parse_until
from kmq.pause import PauseTable, decode_pause, encode_pause

NOW = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.UTC)


def test_pause_round_trip_and_garbage_never_pauses() -> None:
    assert decode_pause(encode_pause(123)) == 123
    for junk in (None, b"", b"\xff", b"[]", b'{"paused_until_ms": "soon"}', b'{"x": 1}',
                 b'{"paused_until_ms": true}'):  # fmt: skip
        assert decode_pause(junk) == 0


@pytest.mark.parametrize(
    ("events", "now_ms", "expected"),
    [
        ([], 0, 0),
        ([(b"q", encode_pause(1000))], 999, 1000),
        ([(b"q", encode_pause(1000))], 1000, 0),  # ends exactly at until
        ([(b"q", encode_pause(1000)), (b"q", encode_pause(0))], 0, 0),  # resumed
        ([(b"q", encode_pause(1000)), (b"q", None)], 0, 0),  # tombstone
        ([(b"q", encode_pause(1000)), (b"q", encode_pause(5000))], 2000, 5000),  # latest wins
        ([(b"other", encode_pause(1000))], 0, 0),
        ([(None, encode_pause(1000))], 0, 0),
    ],
)
def test_pause_table(
    events: list[tuple[bytes | None, bytes | None]], now_ms: int, expected: int
) -> None:
    table = PauseTable()
    for key, value in events:
        table.apply(key, value)
    assert table.paused_until_ms("q", now_ms) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("+10m", NOW + datetime.timedelta(minutes=10)),
        ("30s", NOW + datetime.timedelta(seconds=30)),
        ("+1.5h", NOW + datetime.timedelta(minutes=90)),
        ("2d", NOW + datetime.timedelta(days=2)),
        ("2026-11-22T18:00:00Z", datetime.datetime(2026, 11, 22, 18, tzinfo=datetime.UTC)),
        ("2026-11-22T18:00:00", datetime.datetime(2026, 11, 22, 18, tzinfo=datetime.UTC)),
        (
            "2026-11-22T18:00:00+01:00",
            datetime.datetime(2026, 11, 22, 17, tzinfo=datetime.UTC),
        ),
    ],
)
def test_parse_until(text: str, expected: datetime.datetime) -> None:
    assert parse_until(text, NOW) == expected


@pytest.mark.parametrize("text", ["soon", "10 minutes", "-5m", "", "+m"])
def test_parse_until_rejects_nonsense(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_until(text, NOW)
