"""The pause table and its wire format, the control table that routes control-topic records
to pauses and layouts, and the CLI's --until parsing."""

from __future__ import annotations

import datetime

import click
import pytest

from kmq.cli.pause import parse_until
from kmq.control import LAYOUT_PREFIX, UNREAD_VALUE, ControlTable, layout_key, unread_key
from kmq.layout import TopicLayout, encode_layout
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
    """The same events through the control table (keys as on the topic) and, for those
    with a key, straight into the pause table."""
    control = ControlTable()
    pauses = PauseTable()
    for key, value in events:
        control.apply(key, value)
        if key is not None:
            pauses.apply(key.decode(), value)
    assert control.pauses.paused_until_ms("q", now_ms) == expected
    assert pauses.paused_until_ms("q", now_ms) == expected


LAYOUT = TopicLayout(8, 2, {"hot": 4}, legacy_end={0: 10})
OTHER = TopicLayout(16)


@pytest.mark.parametrize(
    ("events", "layouts"),
    [
        ([], {}),
        ([(layout_key("t"), encode_layout(LAYOUT))], {"t": LAYOUT}),
        ([(b"layout t", encode_layout(LAYOUT))], {"t": LAYOUT}),
        ([(layout_key("t"), encode_layout(LAYOUT)), (layout_key("t"), encode_layout(OTHER))],
         {"t": OTHER}),  # latest wins
        ([(layout_key("t"), encode_layout(LAYOUT)), (layout_key("t"), None)], {}),  # tombstone
        ([(layout_key("t"), encode_layout(LAYOUT)), (layout_key("t"), b"garbage")], {}),
        ([(layout_key("t"), encode_layout(LAYOUT)), (layout_key("u"), encode_layout(OTHER))],
         {"t": LAYOUT, "u": OTHER}),
        ([(layout_key("a b"), encode_layout(LAYOUT))], {"a b": LAYOUT}),  # spaces in a topic
        ([(b"t", encode_layout(LAYOUT))], {}),  # a queue id, not a layout key
        ([(b"layoutt", encode_layout(LAYOUT))], {}),
        ([(b"", encode_layout(LAYOUT)), (None, encode_layout(LAYOUT))], {}),
    ],
)  # fmt: skip
def test_control_table_layouts(
    events: list[tuple[bytes | None, bytes | None]], layouts: dict[str, TopicLayout]
) -> None:
    table = ControlTable()
    for key, value in events:
        table.apply(key, value)
    for topic in ("t", "u", "a b", "", "layout t"):
        assert table.layout(topic) == layouts.get(topic)


def test_layout_records_never_pause_and_pauses_never_lay_out() -> None:
    table = ControlTable()
    table.apply(layout_key("q"), encode_pause(5000))
    table.apply(b"q", encode_layout(LAYOUT))
    assert table.pauses.paused_until_ms("q", 0) == 0
    assert table.pauses.paused_until_ms("layout q", 0) == 0
    assert table.layout("q") is None
    table.apply(b"q", encode_pause(5000))
    table.apply(layout_key("q"), encode_layout(LAYOUT))
    assert (table.pauses.paused_until_ms("q", 0), table.layout("q")) == (5000, LAYOUT)


def test_layout_key() -> None:
    assert layout_key("kmq.queue") == b"layout kmq.queue"
    assert layout_key("t").decode().startswith(LAYOUT_PREFIX)


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


def test_the_control_table_keeps_unread_notices_apart_from_pauses() -> None:
    table = ControlTable()
    table.apply(unread_key("t.retry", 2, "q"), UNREAD_VALUE)
    table.apply(unread_key("t.retry", 0, "q"), UNREAD_VALUE)
    table.apply(unread_key("other.retry", 1, "q"), UNREAD_VALUE)
    for junk in (b"unread t.retry x q", b"unread t.retry 1", b"unread  1 q", b"unread "):
        table.apply(junk, UNREAD_VALUE)
    assert table.unread("t.retry", "q") == {0, 2}
    assert table.unread_notices("t.retry") == [("q", 0), ("q", 2)]
    assert table.unread("t.retry", "p") == frozenset()
    assert table.pauses.paused_until_ms("unread t.retry 2 q", 0) == 0
    table.apply(unread_key("t.retry", 2, "q"), None)  # withdrawn
    table.apply(unread_key("t.retry", 0, "q"), b"")
    assert table.unread("t.retry", "q") == frozenset() and table.unread_notices("t.retry") == []


def test_an_earlier_release_takes_an_unread_notice_for_a_queue_that_is_not_paused() -> None:
    pauses = PauseTable()
    pauses.apply(unread_key("t.retry", 2, "q").decode(), UNREAD_VALUE)
    assert pauses.paused_until_ms("q", 0) == 0 and decode_pause(UNREAD_VALUE) == 0
