"""Per-queue partition placement on a shared topic, the old everywhere-layout, and the
layout's wire format on the control topic."""

from __future__ import annotations

import itertools
import json
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.layout import (
    LAYOUT_VERSION,
    MAX_SPREAD,
    PLACED_VERSION,
    TopicLayout,
    away_from_holder,
    base_partition,
    decode_layout,
    encode_layout,
    grown,
    holders_reads,
    mirrored,
    place,
    read_partitions,
    retry_reads,
    spare_candidates,
    toward_live_reader,
    write_partitions,
)

SETTINGS = settings(max_examples=200, deadline=None)


# -- the layout itself --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"partitions": 0},
        {"partitions": -1},
        {"partitions": 4, "spread": 0},
        {"partitions": 4, "spread": MAX_SPREAD + 1},
        {"partitions": 4, "queues": {"hot": 0}},
        {"partitions": 4, "queues": {"hot": MAX_SPREAD + 1}},
        {"partitions": 4, "placed": {"q": 4}},
        {"partitions": 4, "placed": {"q": -1}},
    ],
)
def test_invalid_layouts_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        TopicLayout(**kwargs)


def test_spread_of() -> None:
    layout = TopicLayout(8, 2, {"hot": 5, "huge": MAX_SPREAD})
    assert layout.spread_of("cold") == 2
    assert layout.spread_of("hot") == 5
    assert layout.spread_of("huge") == 8, "never more than the partitions there are"
    assert TopicLayout(1, 1).spread_of("any") == 1


def test_base_partition_is_crc32() -> None:
    for queue in ("orders", "q", "π"):
        assert base_partition(queue, 16) == zlib.crc32(queue.encode()) % 16
    assert base_partition("orders", 16) == 14  # pinned: moving it would strand records


# -- where records go ---------------------------------------------------------------------------

BASE = base_partition("orders", 8)  # 6
OWN4 = base_partition("orders", 4)  # 2


@pytest.mark.parametrize(
    ("layout", "actual", "expected"),
    [
        (None, 4, (0, 1, 2, 3)),  # the 0.1 layout: every partition
        (TopicLayout(8, 1), 8, (BASE,)),
        (TopicLayout(8, 2), 8, (6, 7)),
        (TopicLayout(8, 3), 8, (6, 7, 0)),  # the window wraps around
        (TopicLayout(8, 8), 8, (6, 7, 0, 1, 2, 3, 4, 5)),
        (TopicLayout(8, 2, {"orders": 4}), 8, (6, 7, 0, 1)),
        (TopicLayout(8, 2, {"other": 4}), 8, (6, 7)),
        (TopicLayout(8, 2), 32, (6, 7)),  # partitions added later move nothing
        (TopicLayout(8, 3), 2, (0, 1)),  # fewer partitions than the layout says
    ],
)
def test_write_partitions(
    layout: TopicLayout | None, actual: int, expected: tuple[int, ...]
) -> None:
    assert (BASE, OWN4) == (6, 2)
    assert write_partitions(layout, "orders", actual) == expected


PLACED = TopicLayout(8, 2, {"hot": 3}, legacy_end={}, placed={"orders": 3, "hot": 7})


@pytest.mark.parametrize(
    ("queue", "actual", "expected"),
    [
        ("orders", 8, (3, 4)),  # not at its hash's partition 6
        ("hot", 8, (7, 0, 1)),  # a placed window grows and wraps like any other
        ("cold", 8, (base_partition("cold", 8), (base_partition("cold", 8) + 1) % 8)),
        ("orders", 32, (3, 4)),  # partitions added later move nothing
        ("hot", 4, (3, 0, 1)),  # fewer partitions than the layout says
    ],
)
def test_a_placed_queue_starts_where_the_layout_says(
    queue: str, actual: int, expected: tuple[int, ...]
) -> None:
    assert write_partitions(PLACED, queue, actual) == expected
    assert read_partitions(PLACED, queue, actual) == dict.fromkeys(expected)


@pytest.mark.parametrize(
    ("partitions", "spread", "queues", "expected"),
    [
        (64, 4, [f"q{i}" for i in range(16)], {f"q{i}": 4 * i for i in range(16)}),
        (8, 2, ["b", "a", "c"], {"b": 0, "a": 2, "c": 4}),  # in the order given
        (8, 2, ["a", "a"], {"a": 0}),
        (4, 2, ["a", "b", "c", "d"], {"a": 0, "b": 2, "c": 0, "d": 2}),  # shared evenly
        (3, 2, ["a", "b"], {"a": 0, "b": 1}),  # three partitions for two: one shared
        (4, 9, ["a", "b"], {"a": 0, "b": 0}),  # a window as wide as the topic
        (8, 2, [], {}),
    ],
)
def test_place(partitions: int, spread: int, queues: list[str], expected: dict[str, int]) -> None:
    assert place(partitions, spread, queues) == expected


@SETTINGS
@given(
    st.integers(1, 64),
    st.integers(1, 16),
    st.lists(st.text("abcdefgh", min_size=1, max_size=3), max_size=20, unique=True),
)
def test_placed_windows_are_disjoint_while_the_partitions_suffice(
    partitions: int, spread: int, queues: list[str]
) -> None:
    placed = place(partitions, spread, queues)
    assert list(placed) == queues
    layout = TopicLayout(partitions, spread, placed=placed)
    loads = [0] * partitions
    for queue in queues:
        for partition in write_partitions(layout, queue, partitions):
            loads[partition] += 1
    width = min(spread, partitions)
    if len(queues) * width <= partitions:
        assert max(loads, default=0) <= 1, loads
    # Never two queues more on one partition than on another, as hashing often does.
    assert max(loads, default=0) - min(loads, default=0) <= 2 or not queues
    assert place(partitions, spread, queues) == placed, "deterministic"


def naive_place(partitions: int, spread: int, queues: list[str]) -> dict[str, int]:
    """:func:`place` as its docstring says it, window by window."""
    width, load, placed = min(spread, partitions), [0] * partitions, {}
    for queue in dict.fromkeys(queues):
        windows = [[load[(b + i) % partitions] for i in range(width)] for b in range(partitions)]
        best = min(range(partitions), key=lambda b: (max(windows[b]), sum(windows[b]), b))
        for i in range(width):
            load[(best + i) % partitions] += 1
        placed[queue] = best
    return placed


@SETTINGS
@given(st.integers(1, 40), st.integers(1, 50), st.lists(st.sampled_from("abcdefghijklmnop")))
def test_place_scores_every_window(partitions: int, spread: int, queues: list[str]) -> None:
    assert place(partitions, spread, queues) == naive_place(partitions, spread, queues)


@pytest.mark.parametrize(("partitions", "spread"), [(0, 1), (4, 0), (-1, 2)])
def test_place_refuses_an_empty_window(partitions: int, spread: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        place(partitions, spread, ["a"])


def test_placing_many_queues_is_quick() -> None:
    placed = place(1024, 16, [f"q{i}" for i in range(2000)])  # about a second, not hours
    assert len(placed) == 2000 and len(set(list(placed.values())[:64])) == 64


def test_a_window_wraps_around() -> None:
    queue = next(q for q in (f"q{i}" for i in range(1000)) if base_partition(q, 8) == 7)
    assert write_partitions(TopicLayout(8, 3), queue, 8) == (7, 0, 1)


@st.composite
def _layouts(draw: st.DrawFn) -> TopicLayout:
    partitions = draw(st.integers(1, 64))
    return TopicLayout(
        partitions,
        draw(st.integers(1, 70)),
        draw(st.dictionaries(st.sampled_from(["a", "b", "hot"]), st.integers(1, 70), max_size=3)),
        draw(
            st.one_of(
                st.none(), st.dictionaries(st.integers(0, 80), st.integers(0, 10**12), max_size=5)
            )
        ),
        draw(
            st.dictionaries(
                st.sampled_from(["a", "cold", "orders.dlq"]),
                st.integers(0, partitions - 1),
                max_size=2,
            )
        ),
    )


layouts = _layouts()
queues = st.sampled_from(["a", "b", "hot", "cold", "orders.dlq"])


@SETTINGS
@given(layouts, queues, st.integers(1, 80))
def test_write_partitions_is_one_window(layout: TopicLayout, queue: str, actual: int) -> None:
    out = write_partitions(layout, queue, actual)
    modulus = min(layout.partitions, actual)
    assert len(out) == len(set(out)) == min(layout.spread_of(queue), modulus)
    placed = layout.placed.get(queue)
    assert out[0] == (base_partition(queue, modulus) if placed is None else placed % modulus)
    assert all(b == (a + 1) % modulus for a, b in itertools.pairwise(out))
    assert all(0 <= p < actual for p in out)
    if actual >= layout.partitions:
        assert out == write_partitions(layout, queue, layout.partitions)


# -- what a group reads -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (None, dict.fromkeys(range(4))),
        (TopicLayout(4, 1, legacy_end=None), dict.fromkeys(range(4))),
        (TopicLayout(4, 1, legacy_end={}), {OWN4: None}),
        (TopicLayout(4, 1, legacy_end={0: 0, 1: 0}), {OWN4: None}),  # 0: none there
        (TopicLayout(4, 1, legacy_end={0: 5, 3: 9}), {OWN4: None, 0: 5, 3: 9}),
        (TopicLayout(4, 1, legacy_end={OWN4: 5}), {OWN4: None}),  # its own: all
        (TopicLayout(4, 1, legacy_end={7: 5}), {OWN4: None}),  # no such partition
    ],
)
def test_read_partitions(layout: TopicLayout | None, expected: dict[int, int | None]) -> None:
    assert read_partitions(layout, "orders", 4) == expected


@SETTINGS
@given(layouts, queues, st.integers(1, 80))
def test_a_group_reads_its_own_partitions_and_every_old_record(
    layout: TopicLayout, queue: str, actual: int
) -> None:
    wanted = read_partitions(layout, queue, actual)
    own = write_partitions(layout, queue, actual)
    assert all(wanted[p] is None for p in own), "its own partitions, to no end"
    for partition in range(actual):
        legacy = layout.legacy_end
        if partition in own:
            continue
        if legacy is None:
            assert wanted[partition] is None
        elif legacy.get(partition, 0) > 0:
            assert wanted[partition] == legacy[partition]
        else:
            assert partition not in wanted
    assert set(wanted) <= set(range(actual))


# -- growing a queue's spread -------------------------------------------------------------------


def test_grown_widens_one_queue_and_keeps_the_rest() -> None:
    layout = TopicLayout(8, 2, {"a": 3}, legacy_end={1: 4})
    wider = grown(layout, "hot", 5)
    assert wider == TopicLayout(8, 2, {"a": 3, "hot": 5}, legacy_end={1: 4})
    assert layout.queues == {"a": 3}, "the original is left alone"
    assert write_partitions(wider, "hot", 8)[:2] == write_partitions(layout, "hot", 8)
    assert grown(wider, "hot", 5) == wider, "the same spread again is fine"
    placed = TopicLayout(8, 2, placed={"hot": 6})
    assert grown(placed, "hot", 3).placed == {"hot": 6}


@pytest.mark.parametrize(("queue", "spread"), [("a", 2), ("cold", 1)])
def test_a_spread_never_shrinks(queue: str, spread: int) -> None:
    layout = TopicLayout(8, 2, {"a": 3})
    with pytest.raises(ValueError, match="only grow"):
        grown(layout, queue, spread)


@SETTINGS
@given(layouts, queues, st.integers(1, MAX_SPREAD))
def test_growing_keeps_every_partition_the_queue_had(
    layout: TopicLayout, queue: str, spread: int
) -> None:
    try:
        wider = grown(layout, queue, spread)
    except ValueError:
        assert spread < layout.spread_of(queue)
        return
    before = set(write_partitions(layout, queue, layout.partitions))
    assert before <= set(write_partitions(wider, queue, layout.partitions))
    for other in ("a", "b", "hot", "cold"):
        if other != queue:
            assert wider.spread_of(other) == layout.spread_of(other)


# -- the wire format ----------------------------------------------------------------------------


@SETTINGS
@given(layouts)
def test_layout_round_trip(layout: TopicLayout) -> None:
    assert decode_layout(encode_layout(layout)) == layout


def test_layout_wire_format_is_pinned() -> None:
    layout = TopicLayout(16, 2, {"hot": 4}, legacy_end={0: 7})
    assert json.loads(encode_layout(layout)) == {
        "version": LAYOUT_VERSION,
        "partitions": 16,
        "spread": 2,
        "queues": {"hot": 4},
        "legacy_end": {"0": 7},
    }
    assert LAYOUT_VERSION == 2


def test_a_placed_layout_is_version_3() -> None:
    layout = TopicLayout(16, 2, placed={"orders": 4})
    assert json.loads(encode_layout(layout)) == {
        "version": PLACED_VERSION,
        "partitions": 16,
        "spread": 2,
        "queues": {},
        "legacy_end": None,
        "placed": {"orders": 4},
    }
    assert PLACED_VERSION == 3
    # A version 2 record names no placements, whatever else it holds.
    assert decode_layout(doc(placed={"q": 1})) == TopicLayout(4, 1)


def doc(**changes: Any) -> bytes:
    base: dict[str, Any] = {"version": LAYOUT_VERSION, "partitions": 4, "spread": 1}
    return json.dumps({**base, **changes}).encode()


def test_doc_helper_builds_a_valid_layout() -> None:
    assert decode_layout(doc()) == TopicLayout(4, 1)
    assert decode_layout(doc(queues=None, legacy_end={"2": 0})) == TopicLayout(4, legacy_end={2: 0})


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"{",
        b"\xff\xfe",
        b"[]",
        b"null",
        b"3",
        doc(version=1),
        doc(version=None),
        doc(partitions=0),
        doc(partitions=-4),
        doc(partitions=True),
        doc(partitions=4.0),
        doc(partitions="4"),
        doc(spread=0),
        doc(spread=MAX_SPREAD + 1),
        doc(queues=[1]),
        doc(queues={"q": -1}),
        doc(queues={"q": "2"}),
        doc(legacy_end=[1]),
        doc(legacy_end={"x": 1}),
        doc(legacy_end={"-1": 1}),
        doc(legacy_end={"1": -1}),
        b'{"version": 2, "spread": 1}',
        doc(version=PLACED_VERSION),  # no placements
        doc(version=PLACED_VERSION, placed=[1]),
        doc(version=PLACED_VERSION, placed={"q": 4}),  # beyond the 4 partitions
        doc(version=PLACED_VERSION, placed={"q": -1}),
        doc(version=PLACED_VERSION, placed={"q": "1"}),
        doc(version=4, placed={}),
        b"[" * 100_000,  # nested past the recursion limit
    ],
)
def test_unreadable_layouts_read_as_none(value: bytes | None) -> None:
    assert decode_layout(value) is None


@SETTINGS
@given(st.binary(max_size=200))
def test_decode_layout_never_raises(value: bytes) -> None:
    layout = decode_layout(value)
    assert layout is None or layout.partitions >= 1


# -- which retry-lane partitions go with which queue partitions -----------------------------

MIRRORED = {
    "same windows": ((5, 6), (5, 6), {5}, {5}),
    "retry window wider": ((5, 6), (2, 3, 4), {5}, {2, 4}),
    "retry window narrower": ((0, 1, 2), (7, 8), {2}, set()),
    "everything owned": ((0, 1, 2), (7, 8), {0, 1, 2}, {7, 8}),
    "nothing owned": ((0, 1), (0, 1), set(), set()),
    "no queue window": ((), (0, 1), {0}, set()),
}


@pytest.mark.parametrize(("queue", "retry", "owned", "expected"), MIRRORED.values(),
                         ids=MIRRORED.keys())  # fmt: skip
def test_mirrored(
    queue: tuple[int, ...], retry: tuple[int, ...], owned: set[int], expected: set[int]
) -> None:
    assert mirrored(queue, retry, owned) == expected


AWAY = {
    "queue record to the next reader's": ((5, 6), (2, 3, 4), 5, False, 3),
    "and back": ((5, 6), (2, 3, 4), 6, False, 2),
    "retry record read with 5 (partition 4)": ((5, 6), (2, 3, 4), 4, True, 3),
    "retry record read with 6": ((5, 6), (2, 3, 4), 3, True, 2),
    "window of one": ((5,), (2, 3), 5, False, None),
    "retry window of one": ((5, 6), (2,), 5, False, None),
    "outside the window": ((5, 6), (2, 3, 4), 9, False, None),
    "queue partition without a retry partition of its own": ((0, 1, 2), (7, 8), 2, False, 8),
}


@pytest.mark.parametrize(("queue", "retry", "read_from", "is_retry", "expected"), AWAY.values(),
                         ids=AWAY.keys())  # fmt: skip
def test_away_from_holder(
    queue: tuple[int, ...],
    retry: tuple[int, ...],
    read_from: int,
    is_retry: bool,
    expected: int | None,
) -> None:
    assert away_from_holder(queue, retry, read_from, is_retry) == expected


windows = st.lists(st.integers(0, 40), min_size=1, max_size=8, unique=True).map(tuple)


@settings(max_examples=300, deadline=None)
@given(windows, windows, st.data())
def test_a_copy_never_goes_to_a_partition_its_holder_reads(
    queue: tuple[int, ...], retry: tuple[int, ...], data: st.DataObject
) -> None:
    """Whoever reads the queue partition (or retry partition) a record came from, by
    ``mirrored`` it does not read the partition its copy goes to, unless every partition
    goes with one queue partition; and every retry partition has exactly one reader."""
    lane_is_retry = data.draw(st.booleans())
    read_from = data.draw(st.sampled_from(retry if lane_is_retry else queue))
    holder_reads = (
        mirrored(queue, retry, {queue[retry.index(read_from) % len(queue)]})
        if lane_is_retry
        else mirrored(queue, retry, {read_from})
    )
    away = away_from_holder(queue, retry, read_from, lane_is_retry)
    if min(len(queue), len(retry)) < 2:
        assert away is None
    else:
        assert away in retry and away not in holder_reads
    readers = [mirrored(queue, retry, {q}) for q in queue]
    assert sorted(p for ps in readers for p in ps) == sorted(retry)


HOLDERS_READS = {
    "a queue record: what goes with its partition": ((5, 6), (2, 3, 4), 5, False, {2, 4}),
    "the other": ((5, 6), (2, 3, 4), 6, False, {3}),
    "a retry record: the same, read back from it": ((5, 6), (2, 3, 4), 4, True, {2, 4}),
    "a retry record outside the window": ((5, 6), (2, 3), 9, True, {9}),
    "no queue window": ((), (2, 3), 5, False, set()),
}


@pytest.mark.parametrize(("queue", "retry", "read_from", "is_retry", "expected"),
                         HOLDERS_READS.values(), ids=HOLDERS_READS.keys())  # fmt: skip
def test_holders_reads(
    queue: tuple[int, ...], retry: tuple[int, ...], read_from: int, is_retry: bool,
    expected: set[int],
) -> None:  # fmt: skip
    assert holders_reads(queue, retry, read_from, is_retry) == expected


# queue window, retry window, read from, lane is retry, live, spread by: chosen
TOWARD_LIVE = {
    "the usual choice when it is read": ((5, 6, 7), (2, 3, 4), 5, False, {3, 4}, 0, 3),
    "another live one when it is not": ((5, 6, 7), (2, 3, 4), 5, False, {4}, 0, 4),
    "spread by offset": ((5, 6, 7, 8), (1, 2, 3, 4), 5, False, {3, 4}, 1, 4),
    "never the holder's, even if live": ((5, 6, 7), (2, 3, 4), 5, False, {2}, 0, None),
    "nobody live": ((5, 6, 7), (2, 3, 4), 5, False, set(), 0, None),
    "a spare outside the window counts": ((5, 6), (2, 3), 5, False, {9}, 0, 9),
    "but the usual choice first": ((5, 6), (2, 3), 5, False, {3, 9}, 0, 3),
    "a queue window of one: its holder reads all": ((5,), (2, 3), 5, False, {3}, 0, None),
    "but not a spare": ((5,), (2, 3), 5, False, {3, 0}, 0, 0),
    "a copy read from a spare, away from it": ((5, 6), (2, 3), 9, True, {9, 8}, 0, 8),
    "a retry record, away from its reader": ((5, 6, 7), (2, 3, 4), 2, True, {2, 4}, 0, 4),
}


@pytest.mark.parametrize(("queue", "retry", "read_from", "is_retry", "live", "spread", "expected"),
                         TOWARD_LIVE.values(), ids=TOWARD_LIVE.keys())  # fmt: skip
def test_toward_live_reader(
    queue: tuple[int, ...], retry: tuple[int, ...], read_from: int, is_retry: bool,
    live: set[int], spread: int, expected: int | None,
) -> None:  # fmt: skip
    assert toward_live_reader(queue, retry, read_from, is_retry, live, spread) == expected


@settings(max_examples=300, deadline=None)
@given(windows, windows, st.data())
def test_a_copy_goes_to_a_live_reader_other_than_its_holder_whenever_there_is_one(
    queue: tuple[int, ...], retry: tuple[int, ...], data: st.DataObject
) -> None:
    lane_is_retry = data.draw(st.booleans())
    read_from = data.draw(st.sampled_from(retry if lane_is_retry else queue))
    live = data.draw(st.sets(st.sampled_from(retry) | st.integers(0, 40)))
    spread = data.draw(st.integers(0, 2**44))
    held = holders_reads(queue, retry, read_from, lane_is_retry)
    chosen = toward_live_reader(queue, retry, read_from, lane_is_retry, live, spread)
    if live - held:
        assert chosen in live - held
    else:
        assert chosen is None


def test_spare_candidates_are_the_retry_partitions_the_queue_does_not_read_otherwise() -> None:
    assert spare_candidates(6, {1, 2}) == [0, 3, 4, 5]
    assert spare_candidates(2, {0, 1}) == [], "a queue on every partition has no spares"
    assert spare_candidates(3, {0, 1, 2, 7}) == []


RETRY_READS = {
    "the window only, as mirrored": ((5, 6), (2, 3, 4), {2, 3, 4}, {5}, {2, 4}),
    "an old-layout partition goes by its number": ((5, 6), (2, 3), {2, 3, 9}, {6}, {3, 9}),
    "and to the other owner": ((5, 6), (2, 3), {2, 3, 9}, {5}, {2}),
    "only what the queue reads": ((5, 6), (2, 3), {3}, {5, 6}, {3}),
    "nothing owned": ((0, 1), (0, 1), {0, 1, 7}, set(), set()),
    "no queue window": ((), (0, 1), {0, 1}, {0}, set()),
}


@pytest.mark.parametrize(("queue", "retry", "read", "owned", "expected"), RETRY_READS.values(),
                         ids=RETRY_READS.keys())  # fmt: skip
def test_retry_reads(
    queue: tuple[int, ...],
    retry: tuple[int, ...],
    read: set[int],
    owned: set[int],
    expected: set[int],
) -> None:
    assert retry_reads(queue, retry, read, owned) == expected


@settings(max_examples=300, deadline=None)
@given(windows, windows, st.sets(st.integers(0, 60), max_size=10), st.data())
def test_every_retry_partition_has_exactly_one_reader(
    queue: tuple[int, ...], retry: tuple[int, ...], old: set[int], data: st.DataObject
) -> None:
    """However the queue window is split among consumers, each retry partition the queue
    reads (its window and any old-layout ones) is read by exactly one of them."""
    members = data.draw(st.integers(1, len(queue)))
    owner = {q: data.draw(st.integers(0, members - 1)) for q in queue}
    read = set(retry) | old
    readers = [
        retry_reads(queue, retry, read, {q for q in queue if owner[q] == m}) for m in range(members)
    ]
    assert sorted(p for ps in readers for p in ps) == sorted(read)
    assert readers[owner[queue[0]]] >= mirrored(queue, retry, {queue[0]})
