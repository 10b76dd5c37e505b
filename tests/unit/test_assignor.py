"""The layout assignor: each declared partition to one member that declared it, evened out."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.coordinator.assignors.abstract import RebalanceProtocol
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from kmq.assignor import (
    NAME,
    LayoutAssignor,
    assign,
    assign_spares,
    decode_declared,
    decode_spares,
    encode_declared,
    encode_spares,
)

SETTINGS = settings(max_examples=200, deadline=None)

Member = tuple[str, set[str], dict[str, set[int]] | None]
Owned = dict[str, list[tuple[str, int]]]


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


@SETTINGS
@given(members_st, existing_st, st.randoms(use_true_random=False))
def test_member_order_does_not_decide_ties(
    members: list[Member], partitions_of: dict[str, set[int]], rng: Any
) -> None:
    shuffled = list(members)
    rng.shuffle(shuffled)
    assert assign(shuffled, partitions_of) == assign(members, partitions_of)


def test_ties_are_spread_over_members_across_groups() -> None:
    """Each queue's group breaks its ties apart from the others: with sixty one-partition
    queues and three idle members, no member is left out (by member order, the first would
    take all sixty)."""
    members: list[Member] = [(f"w{i}", {"t"}, None) for i in range(3)]
    wins = Counter(
        member_id
        for q in range(60)
        for member_id, by_topic in assign(members, {"t": {q}}).items()
        if by_topic
    )
    assert sum(wins.values()) == 60
    assert min(wins[m] for m, _, _ in members) >= 10, wins


def test_a_killed_workers_partitions_do_not_all_go_to_its_restarted_successor() -> None:
    """Three workers, two partitions per queue: w0 is killed and restarted (a new member id
    that sorts first), w1 keeps its partition, w2 had none. Across forty queues' groups the
    orphaned partitions are shared by the two idle members; with ties broken by member
    order, the long-lived w2 got none in a whole chaos run."""
    wins: Counter[str] = Counter()
    for q in range(40):
        members: list[Member] = [
            (f"chaos-w0.2-consumer-{q}", {"t"}, None),
            (f"chaos-w1.1-consumer-{q}", {"t"}, None),
            (f"chaos-w2.1-consumer-{q}", {"t"}, None),
        ]
        owned: Owned = {f"chaos-w1.1-consumer-{q}": [("t", 1)]}  # w0.1 held 0; it is gone
        for member_id, by_topic in assign(members, {"t": {0, 1}}, owned).items():
            if by_topic.get("t") == [0]:
                wins[member_id.split("-")[1]] += 1
    assert sum(wins.values()) == 40
    assert wins["w2.1"] >= 10 and wins["w0.2"] >= 10, wins


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
    # Partitions in order, each to the least loaded member wanting it: 0 only a-plain wants;
    # 1 to z-kmq (less loaded); 2 a tie, which a-plain's rendezvous weight wins; 3 only a-plain.
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


# -- cooperative rebalancing --------------------------------------------------------------------


COOPERATIVE: dict[str, tuple[list[Member], Owned, dict[str, dict[str, list[int]]]]] = {
    "everyone-keeps-what-they-read": (
        [("a", {"t"}, None), ("b", {"t"}, None)],
        {"a": [("t", 2), ("t", 3)], "b": [("t", 0), ("t", 1)]},
        {"a": {"t": [2, 3]}, "b": {"t": [0, 1]}},
    ),
    "a-dead-members-partitions-go-to-the-others-at-once": (
        [("a", {"t"}, None), ("b", {"t"}, None)],
        {"a": [("t", 0)], "b": [("t", 1)]},  # c, which read 2 and 3, is gone
        {"a": {"t": [0, 2]}, "b": {"t": [1, 3]}},
    ),
    "a-newcomer-waits-for-a-partition-to-be-given-up": (
        [("a", {"t"}, None), ("b", {"t"}, None)],
        {"a": [("t", 0), ("t", 1), ("t", 2), ("t", 3)]},
        {"a": {"t": [2, 3]}, "b": {}},  # 0 and 1 move to b next round, once a let them go
    ),
    "a-partition-no-longer-wanted-by-its-reader-moves-in-two-rounds": (
        [("a", {"t"}, {"t": {0}}), ("b", {"t"}, {"t": {1}})],
        {"a": [("t", 0), ("t", 1)]},
        {"a": {"t": [0]}, "b": {}},
    ),
    "two-claimants-the-first-keeps-it": (
        [("a", {"t"}, None), ("b", {"t"}, None)],
        {"a": [("t", 0)], "b": [("t", 0), ("t", 1)]},
        {"a": {"t": [0, 2]}, "b": {"t": [1, 3]}},
    ),
}


@pytest.mark.parametrize(
    ("members", "owned", "expected"), COOPERATIVE.values(), ids=COOPERATIVE.keys()
)
def test_cooperative_assign(
    members: list[Member], owned: Owned, expected: dict[str, dict[str, list[int]]]
) -> None:
    assert assign(members, T4, owned) == expected


def _held(result: dict[str, dict[str, list[int]]]) -> Owned:
    return {m: [(t, p) for t, ps in by_topic.items() for p in ps] for m, by_topic in result.items()}


def _rounds(
    members: list[Member],
    partitions_of: dict[str, set[int]],
    owned: Owned,
) -> Owned:
    """Three cooperative rounds from ``owned``, checking that none gives a member a partition
    another member still holds; what the members hold after them."""
    for _round in range(3):
        result = assign(members, partitions_of, owned)
        held_before = {tp for tps in owned.values() for tp in tps}
        for member_id, tps in _held(result).items():
            for tp in tps:
                assert tp in owned[member_id] or tp not in held_before, (
                    f"{tp} given to {member_id} while another member still holds it"
                )
        owned = _held(result)
    return owned


@SETTINGS
@given(members_st, existing_st, st.data())
def test_cooperative_rounds_never_give_a_partition_to_two_members_and_settle(
    members: list[Member], partitions_of: dict[str, set[int]], data: st.DataObject
) -> None:
    """From any holding (members may hold anything, even twice), each round gives a member
    only what it holds or what nobody holds; within two rounds the result is what a fresh
    eager assignment would guarantee: every wanted partition with one member that wants it."""
    ids = [m for m, _, _ in members]
    every = sorted((t, p) for t, ps in partitions_of.items() for p in ps)
    owned: Owned = {
        m: data.draw(st.lists(st.sampled_from(every), unique=True)) if every else [] for m in ids
    }
    owned = _rounds(members, partitions_of, owned)
    assert owned == _held(assign(members, partitions_of, owned)), "settled: no more moves"
    wanted_fresh = assign(members, partitions_of)  # eager: the set of partitions it places
    placed = sorted(tp for tps in _held(wanted_fresh).values() for tp in tps)
    assert sorted(tp for tps in owned.values() for tp in tps) == placed


@SETTINGS
@given(st.integers(1, 6), st.sets(st.integers(0, 20), min_size=1), st.data())
def test_cooperative_rounds_even_out_members_wanting_the_same(
    count: int, partitions: set[int], data: st.DataObject
) -> None:
    members: list[Member] = [(f"m{i}", {"t"}, None) for i in range(count)]
    ordered = sorted(partitions)
    owned: Owned = {f"m{i}": [] for i in range(count)}
    for p in data.draw(st.lists(st.sampled_from(ordered), unique=True)):
        owned[f"m{data.draw(st.integers(0, count - 1))}"].append(("t", p))
    for _round in range(2):
        owned = _held(assign(members, {"t": partitions}, owned))
    loads = [len(tps) for tps in owned.values()]
    assert sum(loads) == len(partitions)
    assert max(loads) - min(loads) <= 1


def test_cooperative_assignor_sends_what_it_owns_and_reads_it_back() -> None:
    held = [SimpleNamespace(topic="t", partition=1), SimpleNamespace(topic="t", partition=2)]
    a = LayoutAssignor(lambda: {"t": {0, 1, 2, 3}}, lambda: held)
    b = LayoutAssignor(lambda: {"t": {0, 1, 2, 3}}, lambda: ())
    assert a.supported_protocols() == [RebalanceProtocol.COOPERATIVE]
    assert LayoutAssignor(lambda: {}).supported_protocols() == [RebalanceProtocol.EAGER]
    meta_a = ConsumerProtocolSubscription.decode(a.metadata({"t"}).encode())
    meta_b = ConsumerProtocolSubscription.decode(b.metadata({"t"}).encode())
    assert decode_declared(meta_a.user_data) == {"t": {0, 1, 2, 3}}
    result = a.assign(Cluster({"t": {0, 1, 2, 3}}), [member("a", meta_a), member("b", meta_b)])
    assert {m: dict(x.assigned_partitions) for m, x in result.items()} == {
        "a": {"t": [1, 2]},
        "b": {"t": [0, 3]},
    }


# -- spare retry-lane partitions ----------------------------------------------------------------


def test_spares_round_trip_and_old_members_say_nothing_of_them() -> None:
    assert decode_spares(encode_declared({"t": {1}}, {3, 2})) == {2, 3}
    assert decode_spares(encode_declared({"t": {1}}, ())) == set()
    assert decode_spares(encode_declared({"t": {1}})) is None, "a member of an earlier release"
    assert decode_spares(encode_spares([5])) == {5}
    for data in (None, b"", b"\xff", b"{", b'{"s": 3}', b'{"s": [-1]}', b'{"s": ["x"]}'):
        assert decode_spares(data) is None, data


# members (id, spares read now or None), load, candidates: spares given
Spares = list[tuple[str, set[int] | None]]
SPARES: dict[str, tuple[Spares, dict[str, int], set[int], dict[str, list[int]]]] = {
    "an idle member gets one": ([("a", set()), ("b", set())], {"a": 1}, {3}, {"a": [], "b": [3]}),
    "an owner gets none": ([("a", set())], {"a": 2}, {2, 3}, {"a": []}),
    "a spare stays with its member": (
        [("a", {2}), ("b", set())], {"a": 1}, {2}, {"a": [2], "b": []}
    ),
    "claimed twice: the first keeps it": (
        [("a", {2}), ("b", {2})], {"b": 1}, {2, 3}, {"a": [2], "b": []}
    ),
    "one no longer a candidate is dropped": ([("a", {2})], {"a": 1}, {3}, {"a": []}),
    "and an idle member takes a free one instead": ([("a", {2})], {}, {3}, {"a": [3]}),
    "not one given twice": ([("a", set()), ("b", set())], {}, {2}, {"a": [2], "b": []}),
    "none to a member that cannot read spares": ([("a", None)], {}, {2}, {}),
    "no candidates": ([("a", set())], {}, set(), {"a": []}),
}


@pytest.mark.parametrize(("members", "load", "candidates", "expected"), SPARES.values(),
                         ids=SPARES.keys())  # fmt: skip
def test_assign_spares(
    members: Spares, load: dict[str, int], candidates: set[int], expected: dict[str, list[int]]
) -> None:
    assert assign_spares(members, load, candidates) == expected


@SETTINGS
@given(
    st.lists(
        st.tuples(st.sets(st.integers(0, 9)) | st.none(), st.integers(0, 2)),
        min_size=1,
        max_size=6,
    ),
    st.sets(st.integers(0, 9)),
)
def test_spares_are_never_shared_moved_or_left_unused_while_an_idle_member_waits(
    rows: list[tuple[set[int] | None, int]], candidates: set[int]
) -> None:
    members = [(f"m{i}", held) for i, (held, _) in enumerate(rows)]
    load = {f"m{i}": n for i, (_, n) in enumerate(rows)}
    out = assign_spares(members, load, candidates)
    given = [p for spares in out.values() for p in spares]
    assert len(given) == len(set(given)) and set(given) <= candidates
    claimed: set[int] = set()
    for member_id, held in members:
        if held is None:
            assert member_id not in out
            continue
        for p in out[member_id]:
            # Only what it held, or a partition nobody held: a spare never moves.
            assert p in held or not any(p in (h or ()) for _, h in members)
        claimed |= held
        assert len(out[member_id]) <= max(1, len(held & candidates))
    waiting = [m for m, held in members if held is not None and not out[m] and not load[m]]
    if waiting:
        assert candidates <= set(given) | claimed, "a free spare left while a member idles"


def test_an_orphaned_partition_goes_to_an_idle_member_without_a_spare_first() -> None:
    """The chaos run's stall: three workers, two partitions per queue, one owner killed.
    Had its partition gone to the idle member reading a spare, that member would have kept
    the spare while busy, leaving the third idle with none; when the other owner was then
    killed, nobody read a spare and the copies waited 20 s for the group. Across forty
    queues' groups (forty weights) the spare's reader never wins such a tie, and a
    static member still wins before either."""
    for q in range(40):
        spare, free = f"w0.22-consumer-{q}", f"w2.13-consumer-{q}"
        members: list[Member] = [
            (spare, {"t"}, {"t": {2, 3}}),
            (f"w1.24-consumer-{q}", {"t"}, {"t": {2, 3}}),
            (free, {"t"}, {"t": {2, 3}}),
        ]
        owned: Owned = {f"w1.24-consumer-{q}": [("t", 3)]}
        result = assign(members, T4, owned, spare_readers={spare})
        assert result[free] == {"t": [2]} and result[spare] == {}, result
        static = assign(members, T4, owned, preferred={spare}, spare_readers={spare})
        assert static[spare] == {"t": [2]}, static
        # Load still comes first: a spare's reader takes a partition before anyone takes two.
        both = assign(members[:1] + members[2:], T4, {}, spare_readers={spare})
        assert both[spare] and both[free], both


def test_the_leader_keeps_the_spares_reader_idle() -> None:
    """End to end through kafka-python's side: the member that says it reads a spare is
    passed over for the orphaned partition and keeps its spare."""

    def assignor(held: set[int]) -> LayoutAssignor:
        return LayoutAssignor(
            lambda: {"t": {0, 1}},
            lambda: (),
            spares=lambda: ({2, 3}, held),
            on_spares=lambda spares: None,
        )

    leader = assignor(set())
    decode = ConsumerProtocolSubscription.decode
    for q in range(20):
        spare, free, owner = f"spare-{q}", f"free-{q}", f"owner-{q}"
        members = [
            member(owner, decode(leader.metadata({"t"}).encode())),
            member(spare, decode(assignor({2}).metadata({"t"}).encode())),
            member(free, decode(assignor(set()).metadata({"t"}).encode())),
        ]
        members[0].metadata.owned_partitions = [
            ConsumerProtocolSubscription.TopicPartition(topic="t", partitions=[1])
        ]
        result = leader.assign(Cluster({"t": {0, 1}}), members)
        assert dict(result[free].assigned_partitions) == {"t": [0]}
        assert dict(result[spare].assigned_partitions) == {}
        assert decode_spares(result[spare].user_data) == {2}
        assert decode_spares(result[free].user_data) == set()


def test_the_leader_gives_an_idle_member_a_spare_and_it_hears_of_it() -> None:
    heard: dict[str, frozenset[int]] = {}

    def assignor(name: str, held: set[int]) -> LayoutAssignor:
        return LayoutAssignor(
            lambda: {"t": {0, 1}},
            lambda: (),
            spares=lambda: ({2, 3}, held),
            on_spares=lambda spares: heard.__setitem__(name, spares),
        )

    leader, idle = assignor("a", set()), assignor("c", set())
    meta = [ConsumerProtocolSubscription.decode(x.metadata({"t"}).encode()) for x in (leader, idle)]
    old = ConsumerProtocolSubscription(1, ["t"], encode_declared({"t": {0, 1}}))
    members = [member("a", meta[0]), member("b", old), member("c", meta[1])]
    result = leader.assign(Cluster({"t": {0, 1}}), members)
    assert {m: dict(x.assigned_partitions) for m, x in result.items()} == {
        "a": {"t": [0]},
        "b": {"t": [1]},
        "c": {},
    }
    assert result["b"].user_data == b"", "a member of an earlier release is given no spares"
    for name, x in (("a", leader), ("c", idle)):
        x.on_assignment(ConsumerProtocolAssignment.decode(result[name].encode()), 1)
    assert heard["a"] == frozenset() and len(heard["c"]) == 1 and heard["c"] <= {2, 3}
    # A leader of an earlier release gives none: the member stops reading its spare.
    idle.on_assignment(ConsumerProtocolAssignment(1, [], b""), 2)
    assert heard["c"] == frozenset()
