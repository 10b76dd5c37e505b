"""A consumer's adopted retry partitions (kmq.adopted): those a tracker says nobody reads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kmq.adopted import READOPT_AFTER_S, Adopted

HOLD_S = 12.0
ALL = frozenset(range(8))
"""Every partition read to its end: the give-up rules without waiting for reading."""


def test_a_consumer_reading_nothing_adopts_the_noticed_partitions() -> None:
    adopted = Adopted(HOLD_S)
    assert adopted.update({2, 3}, set(), -1, False, 0.0, read_through=ALL) == (
        frozenset({2, 3}),
        frozenset(),
    )
    assert adopted.partitions == {2, 3}
    assert adopted.update({2, 3}, set(), -1, False, 1.0, read_through=ALL) == (
        frozenset(),
        frozenset(),
    ), "once"


def test_a_consumer_that_reads_the_queues_retry_lane_adopts_nothing() -> None:
    adopted = Adopted(HOLD_S)
    assert adopted.update({2}, {1}, 4, True, 0.0, read_through=ALL) == (frozenset(), frozenset())
    assert adopted.partitions == frozenset()


def test_adopted_partitions_stay_while_the_group_is_unsettled_notice_or_not() -> None:
    adopted = Adopted(HOLD_S)
    adopted.update({2}, set(), -1, False, 0.0, read_through=ALL)
    assert adopted.update(set(), set(), 3, False, 100.0, read_through=ALL) == (
        frozenset(),
        frozenset(),
    )
    assert adopted.partitions == {2}, "given up only once the group has settled"


def test_they_are_given_up_once_the_group_settles_in_a_later_generation() -> None:
    adopted = Adopted(HOLD_S)
    adopted.update({2}, set(), -1, False, 0.0, read_through=ALL)
    assert adopted.update({2}, set(), 0, True, 1.0, read_through=ALL) == (
        frozenset(),
        frozenset({2}),
    )
    assert adopted.partitions == frozenset()


def test_adopted_while_settled_they_stay_through_that_generation_while_noticed() -> None:
    adopted = Adopted(HOLD_S)
    adopted.update({2}, set(), 5, True, 0.0, read_through=ALL)  # an idle member, its owners killed
    assert adopted.update({2}, set(), 5, True, HOLD_S + 1, read_through=ALL) == (
        frozenset(),
        frozenset(),
    )
    assert adopted.update(set(), set(), 5, True, HOLD_S - 1, read_through=ALL) == (
        frozenset(),
        frozenset(),
    )
    assert adopted.update(set(), set(), 5, True, HOLD_S, read_through=ALL) == (
        frozenset(),
        frozenset({2}),
    ), "the group did not move and nobody says it is unread: its owner reads it"


def test_at_a_later_generation_one_not_read_to_its_end_is_kept_until_it_is() -> None:
    # Full chaos run 73: adopted as the member's first join was ending, given up 0.2 s
    # later, once it had settled, before its copies were fetched; then read by nobody for
    # 20 s.
    adopted = Adopted(HOLD_S)
    adopted.update({0, 1}, set(), -1, False, 0.0, read_through=frozenset())
    assert adopted.update({0, 1}, set(), 0, True, 0.2, read_through={1}) == (
        frozenset(),
        frozenset({1}),
    )
    assert adopted.partitions == {0}, "its copies not read yet"
    assert adopted.update(set(), set(), 0, True, 0.5, read_through=frozenset()) == (
        frozenset(),
        frozenset(),
    )
    assert adopted.update(set(), set(), 0, True, 0.7, read_through={0}) == (
        frozenset(),
        frozenset({0}),
    )


def test_one_never_read_to_its_end_is_given_up_after_the_hold() -> None:
    adopted = Adopted(HOLD_S)
    adopted.update({0}, set(), -1, False, 0.0, read_through=frozenset())
    assert adopted.update({0}, set(), 0, True, HOLD_S - 0.1, read_through=frozenset()) == (
        frozenset(),
        frozenset(),
    )
    assert adopted.update({0}, set(), 0, True, HOLD_S, read_through=frozenset()) == (
        frozenset(),
        frozenset({0}),
    ), "a transaction never ended at its end must not keep it for good"


def test_a_partition_given_up_is_not_adopted_again_at_once() -> None:
    adopted = Adopted(HOLD_S)
    adopted.update({2}, set(), -1, False, 0.0, read_through=ALL)
    adopted.update(
        {2}, set(), 0, True, 1.0, read_through=ALL
    )  # given up: the notice not withdrawn yet
    assert (
        adopted.update({2}, set(), 0, True, 1.0 + READOPT_AFTER_S - 0.1, read_through=ALL)[0]
        == frozenset()
    )
    assert adopted.update({2}, set(), 0, True, 1.0 + READOPT_AFTER_S, read_through=ALL)[0] == {2}, (
        "still noticed long after: its owner is gone too"
    )


Step = tuple[frozenset[int], frozenset[int], int, bool, float, frozenset[int]]
events = st.lists(
    st.tuples(
        st.frozensets(st.integers(0, 5), max_size=3),  # noticed
        st.frozensets(st.integers(0, 5), max_size=2),  # reading otherwise
        st.integers(-1, 4),  # generation
        st.booleans(),  # settled
        st.floats(0, 30),  # time step
        st.frozensets(st.integers(0, 5), max_size=6),  # read through
    ),
    max_size=20,
)


@given(events)
def test_adoption_invariants(steps: list[Step]) -> None:
    adopted, now = Adopted(HOLD_S), 0.0
    for noticed, reading, generation, settled, step, read_through in steps:
        now += step
        before = adopted.partitions
        since = dict(adopted._since)
        new, gone = adopted.update(noticed, reading, generation, settled, now,
                                   read_through=read_through)  # fmt: skip
        for p in gone - read_through:
            assert now - since[p][1] >= HOLD_S, "not read to its end: kept for the hold"

        assert new <= noticed, "only what a tracker said nobody reads"
        assert not new or not reading, "only by a consumer reading nothing of the lane"
        assert not gone or settled, "never given up while the group is unsettled"
        assert adopted.partitions == (before - gone) | new
        assert not new & before
