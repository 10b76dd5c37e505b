"""The layout assignor: each declared partition to one member that declared it, evened out."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from kmq.assignor import NAME, LayoutAssignor, assign, decode_declared, encode_declared

SETTINGS = settings(max_examples=200, deadline=None)

Member = tuple[str, set[str], dict[str, set[int]] | None]


def test_declared_round_trip() -> None:
    declared = {"t": [3, 1, 2], "u": []}
    assert decode_declared(encode_declared(declared)) == {"t": {1, 2, 3}, "u": set()}
    assert encode_declared({"t": {2, 1}}) == b'{"v": 1, "t": {"t": [1, 2]}}'


@pytest.mark.parametrize(
    "data", [None, b"", b"\xff", b"{", b"[]", b'{"v": 1}', b'{"t": [1]}', b'{"t": {"x": [null]}}']
)
def test_undeclared_reads_as_none(data: bytes | None) -> None:
    assert decode_declared(data) is None


T4 = {"t": {0, 1, 2, 3}}

ASSIGNMENTS: dict[
    str, tuple[list[Member], dict[str, set[int]], dict[str, dict[str, list[int]]]]
] = {
    "disjoint-windows": (
        [("a", {"t"}, {"t": {0, 1}}), ("b", {"t"}, {"t": {2, 3}})],
        T4,
        {"a": {"t": [0, 1]}, "b": {"t": [2, 3]}},
    ),
    "same-window-evened-out": (
        [("a", {"t"}, {"t": {0, 1}}), ("b", {"t"}, {"t": {0, 1}})],
        T4,
        {"a": {"t": [0]}, "b": {"t": [1]}},
    ),
    "undeclared-partitions-stay-unassigned": (
        [("a", {"t"}, {"t": {1}})],
        T4,
        {"a": {"t": [1]}},
    ),
    "another-client-wants-everything": (
        [("a", {"t"}, None)],
        T4,
        {"a": {"t": [0, 1, 2, 3]}},
    ),
    "missing-partitions-dropped": (
        [("a", {"t"}, {"t": {3, 4, 99, -1}})],
        T4,
        {"a": {"t": [3]}},
    ),
    "unsubscribed-topic-ignored": (
        [("a", {"t"}, {"t": {0}, "u": {0}})],
        {"t": {0}, "u": {0}},
        {"a": {"t": [0]}},
    ),
    "unknown-topic": (
        [("a", {"gone"}, None)],
        T4,
        {"a": {}},
    ),
    "ties-go-to-the-first-member": (
        [("b", {"t"}, {"t": {0}}), ("a", {"t"}, {"t": {0}})],
        T4,
        {"b": {"t": [0]}, "a": {}},
    ),
    "two-topics": (
        [("a", {"t", "u"}, None), ("b", {"u"}, {"u": {0, 1}})],
        {"t": {0}, "u": {0, 1}},
        {"a": {"t": [0], "u": [1]}, "b": {"u": [0]}},
    ),
}


@pytest.mark.parametrize(
    ("members", "partitions_of", "expected"), ASSIGNMENTS.values(), ids=ASSIGNMENTS.keys()
)
def test_assign(
    members: list[Member],
    partitions_of: dict[str, set[int]],
    expected: dict[str, dict[str, list[int]]],
) -> None:
    assert assign(members, partitions_of) == expected


members_st = st.lists(
    st.tuples(
        st.sets(st.sampled_from(["t", "u"]), min_size=1),
        st.one_of(
            st.none(),
            st.dictionaries(st.sampled_from(["t", "u", "x"]), st.sets(st.integers(-1, 9))),
        ),
    ),
    min_size=1,
    max_size=6,
).map(lambda rows: [(f"m{i}", topics, declared) for i, (topics, declared) in enumerate(rows)])
existing_st = st.fixed_dictionaries(
    {"t": st.sets(st.integers(0, 8)), "u": st.sets(st.integers(0, 8))}
)


@SETTINGS
@given(members_st, existing_st)
def test_every_wanted_partition_goes_to_exactly_one_member_that_wants_it(
    members: list[Member], partitions_of: dict[str, set[int]]
) -> None:
    wanted: dict[tuple[str, int], set[str]] = {}
    for member_id, topics, declared in members:
        for topic in topics:
            asked = partitions_of[topic] if declared is None else declared.get(topic, set())
            for partition in asked & partitions_of[topic]:
                wanted.setdefault((topic, partition), set()).add(member_id)
    result = assign(members, partitions_of)
    assert set(result) == {m for m, _, _ in members}
    owners: dict[tuple[str, int], list[str]] = {}
    for member_id, by_topic in result.items():
        for topic, partitions in by_topic.items():
            assert partitions == sorted(partitions)
            for partition in partitions:
                owners.setdefault((topic, partition), []).append(member_id)
    assert set(owners) == set(wanted), "wanted partitions assigned, nothing else"
    for tp, owned_by in owners.items():
        assert len(owned_by) == 1
        assert owned_by[0] in wanted[tp]


@SETTINGS
@given(st.integers(1, 8), st.sets(st.integers(0, 30), min_size=1), st.booleans())
def test_members_wanting_the_same_partitions_share_them_evenly(
    count: int, partitions: set[int], declare: bool
) -> None:
    members: list[Member] = [
        (f"m{i}", {"t"}, {"t": partitions} if declare else None) for i in range(count)
    ]
    result = assign(members, {"t": partitions})
    loads = Counter({m: len(result[m].get("t", [])) for m, _, _ in members})
    assert sum(loads.values()) == len(partitions)
    assert max(loads.values()) - min(loads.values()) <= 1


# -- kafka-python's side ------------------------------------------------------------------------


class Cluster:
    def __init__(self, partitions_of: dict[str, set[int]]) -> None:
        self.partitions_of = partitions_of

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions_of.get(topic)


def member(member_id: str, metadata: Any, instance: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(member_id=member_id, group_instance_id=instance, metadata=metadata)


def test_layout_assignor_end_to_end() -> None:
    asked = []

    def declared() -> dict[str, set[int]]:
        asked.append(1)
        return {"t": {1, 2}}

    assignor = LayoutAssignor(declared)
    assert assignor.name == NAME == "kmq-layout"
    metadata = assignor.metadata({"t"})
    assert asked == [1], "declared() is asked at every join"
    assert (metadata.topics, decode_declared(metadata.user_data)) == (["t"], {"t": {1, 2}})
    other = ConsumerProtocolSubscription(0, ["t"], b"")  # a plain client: wants everything
    result = assignor.assign(
        Cluster({"t": {0, 1, 2, 3}}),
        [member("z-kmq", metadata), member("a-plain", other)],
    )
    assigned = {m: dict(a.assigned_partitions) for m, a in result.items()}
    # Partitions in order, each to the least loaded member wanting it, ties to the first by
    # member id: 0 only a-plain wants; 1 to z-kmq (less loaded); 2 a tie; 3 only a-plain.
    assert assigned == {"a-plain": {"t": [0, 2, 3]}, "z-kmq": {"t": [1]}}


def test_static_members_break_ties_first() -> None:
    assignor = LayoutAssignor(lambda: {"t": {0}})
    metadata = assignor.metadata({"t"})
    result = assignor.assign(
        Cluster({"t": {0}}),
        [member("a", metadata), member("b", metadata, instance="static-b")],
    )
    assert {m: dict(a.assigned_partitions) for m, a in result.items()} == {
        "a": {},
        "b": {"t": [0]},
    }
