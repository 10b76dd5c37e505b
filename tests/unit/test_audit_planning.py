"""format("kmq") options and read planning: pure Python, no Spark, no broker."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.errors import ConfigError, InvalidQueueError
from kmq.spark.options import ReadOptions, WriteOptions, kafka_settings, parse_offsets
from kmq.spark.splits import OffsetRange, ranges_to_read, split_ranges

BS = {"bootstrap_servers": "127.0.0.1:9092"}


def test_read_options_defaults_follow_the_kind() -> None:
    queue = ReadOptions.parse(BS)
    markers = ReadOptions.parse({**BS, "KIND": "Markers"})
    assert (queue.kind, queue.topic) == ("queue", "kmq.queue")
    assert (markers.kind, markers.topic) == ("markers", "kmq.markers")
    assert queue.max_records_per_split == 1_000_000 and queue.end_offsets is None


def test_read_options_parse_every_setting() -> None:
    o = ReadOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1,h:2",
            "topic": "my.queue",
            "queue": "orders",
            "max_records_per_split": "500",
            "start_offsets": '{"1": 5}',
            "end_offsets": '{"0": 10, "1": 20}',
            "kafka.security.protocol": "SSL",
            "kafka.request_timeout_ms": "5000",
        }
    )
    assert (o.bootstrap_servers, o.topic, o.queue) == ("h:1,h:2", "my.queue", "orders")
    assert (o.max_records_per_split, o.start_offsets, o.end_offsets) == (
        500,
        {1: 5},
        {0: 10, 1: 20},
    )
    assert dict(o.kafka) == {"security_protocol": "SSL", "request_timeout_ms": 5000}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "bootstrap_servers is required"),
        ({**BS, "kind": "logs"}, "kind must be"),
        ({**BS, "topic": "bad topic"}, "may only contain"),
        ({**BS, "max_records_per_split": "0"}, ">= 1"),
        ({**BS, "max_records_per_split": "many"}, "must be an integer"),
        ({**BS, "end_offsets": "[1]"}, "JSON object"),
        ({**BS, "end_offsets": '{"x": 1}'}, "not an integer"),
        ({**BS, "end_offsets": '{"0": -1}'}, "not an offset"),
        ({**BS, "start_offsets": "{"}, "not JSON"),
    ],
)
def test_read_options_reject_bad_values(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReadOptions.parse(options)


def test_write_options() -> None:
    o = WriteOptions.parse({**BS, "queue": "orders", "create_topics": "false"})
    assert (o.topic, o.marker_topic, o.queue, o.create_topics) == (
        "kmq.queue",
        "kmq.markers",
        "orders",
        False,
    )
    with pytest.raises(InvalidQueueError):
        WriteOptions.parse({**BS, "queue": "has space"})
    with pytest.raises(ConfigError, match="true or false"):
        WriteOptions.parse({**BS, "create_topics": "maybe"})


def test_kafka_settings_take_only_prefixed_options() -> None:
    got = kafka_settings({"kafka.ssl.check.hostname": "false", "topic": "x", "kafka.": "y"})
    assert got == {"ssl_check_hostname": False}
    assert parse_offsets(None, "x") is None and parse_offsets(" ", "x") is None


def test_ranges_clamp_to_bounds_and_end_offsets_choose_partitions() -> None:
    bounds = {0: (0, 100), 1: (50, 60), 2: (7, 7)}
    assert ranges_to_read("t", bounds) == [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 50, 60)]
    got = ranges_to_read("t", bounds, start_offsets={0: 10, 1: 0}, end_offsets={0: 500, 1: 55})
    assert got == [OffsetRange("t", 0, 10, 100), OffsetRange("t", 1, 50, 55)]
    assert ranges_to_read("t", bounds, end_offsets={1: 60}) == [OffsetRange("t", 1, 50, 60)]
    with pytest.raises(ConfigError, match="lacks"):
        ranges_to_read("t", bounds, end_offsets={9: 1})


def test_split_cuts_large_ranges_evenly() -> None:
    got = split_ranges([OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 0, 3)], 4)
    assert [(r.partition, r.start, r.end) for r in got] == [
        (0, 10, 14),
        (0, 14, 17),
        (0, 17, 20),
        (1, 0, 3),
    ]
    with pytest.raises(ConfigError):
        split_ranges([], 0)


@settings(deadline=None, max_examples=60)
@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2000)), max_size=6),
    st.integers(1, 5000),
)
def test_splits_cover_each_range_exactly_once(spans: list[tuple[int, int]], most: int) -> None:
    ranges = [OffsetRange("t", p, start, start + size) for p, (start, size) in enumerate(spans)]
    splits = split_ranges([r for r in ranges if r.size], most)
    for rng in ranges:
        mine = [s for s in splits if s.partition == rng.partition]
        assert sum(s.size for s in mine) == rng.size
        assert all(0 < s.size <= most for s in mine)
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        if mine:
            assert (mine[0].start, mine[-1].end) == (rng.start, rng.end)
            assert max(s.size for s in mine) - min(s.size for s in mine) <= 1
