"""The consumer's pure core: the keep-alive schedule (Leases) and the batch cycle (poll ->
START written -> commit -> hand out). Scenario tables plus hypothesis state machines."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from kmq.leases import Actions, Batch, BatchCycle, Leases

KEEPALIVE_S = 10.0

# -- Leases: scenario table -----------------------------------------------------------------------
# Each row: events, then the messages whose KEEPALIVE is due at the last event's time.
# Events: ("start", now, [keys]), ("settle", key), ("due", now, expected keys).

Event = tuple[object, ...]

LEASE_SCENARIOS: dict[str, list[Event]] = {
    "nothing-due-before-keepalive": [("start", 0, ["a"]), ("due", 9.999, [])],
    "due-at-keepalive": [("start", 0, ["a"]), ("due", 10, ["a"])],
    "due-in-start-order": [
        ("start", 0, ["a", "b"]),
        ("start", 1, ["c"]),
        ("due", 11, ["a", "b", "c"]),
    ],
    "later-start-not-yet-due": [("start", 0, ["a"]), ("start", 5, ["b"]), ("due", 12, ["a"])],
    "rescheduled-after-keepalive": [
        ("start", 0, ["a"]),
        ("due", 10, ["a"]),
        ("due", 19.999, []),
        ("due", 20, ["a"]),
    ],
    "rescheduled-from-when-it-was-asked": [
        ("start", 0, ["a"]),
        ("due", 15, ["a"]),
        ("due", 24.999, []),
        ("due", 25, ["a"]),
    ],
    "keepalive-moves-it-behind-later-starts": [
        ("start", 0, ["a"]),
        ("start", 5, ["b"]),
        ("due", 10, ["a"]),
        ("due", 20, ["b", "a"]),
    ],
    "settled-is-never-due": [("start", 0, ["a", "b"]), ("settle", "a"), ("due", 10, ["b"])],
    "settle-unknown-is-harmless": [("start", 0, ["a"]), ("settle", "zz"), ("due", 10, ["a"])],
    "started-again-joins-the-back": [
        ("start", 0, ["a", "b"]),
        ("start", 5, ["a"]),
        ("due", 10, ["b"]),
        ("due", 15, ["a"]),
    ],
}


@pytest.mark.parametrize("events", LEASE_SCENARIOS.values(), ids=LEASE_SCENARIOS.keys())
def test_lease_scenarios(events: list[Event]) -> None:
    leases: Leases[str, str] = Leases(KEEPALIVE_S)
    for event in events:
        match event:
            case ("start", float() | int() as now, list() as keys):
                leases.started([(k, k.upper()) for k in keys], float(now))
            case ("settle", str() as key):
                leases.settle(key)
            case ("due", float() | int() as now, list() as expected):
                assert leases.due(float(now)) == [k.upper() for k in expected], event
            case _:
                raise AssertionError(event)


def test_leases_bookkeeping() -> None:
    leases: Leases[int, str] = Leases(KEEPALIVE_S)
    assert len(leases) == 0 and leases.due(1e9) == []
    leases.started([(1, "one"), (2, "two")], 0)
    assert len(leases) == 2 and 1 in leases and 3 not in leases
    assert list(leases) == ["one", "two"]
    assert leases.settle(1) == "one"
    assert leases.settle(1) is None
    leases.started([(3, "three")], 0)
    assert leases.take_all() == ["two", "three"]
    assert len(leases) == 0 and list(leases) == [] and leases.due(1e9) == []


def test_started_again_replaces_the_item() -> None:
    leases: Leases[int, str] = Leases(KEEPALIVE_S)
    leases.started([(1, "old")], 0)
    leases.started([(1, "new")], 1)
    assert list(leases) == ["new"]
    assert leases.due(11) == ["new"]


# -- Leases: hypothesis ---------------------------------------------------------------------------

KEYS = st.integers(0, 6)


class LeasesMachine(RuleBasedStateMachine):
    """Model: each key has a time its KEEPALIVE is due; due(now) gives every key due by
    ``now``, earliest first (ties in the order they were scheduled), and reschedules them."""

    def __init__(self) -> None:
        super().__init__()
        self.leases: Leases[int, tuple[int, int]] = Leases(KEEPALIVE_S)
        self.model: dict[int, tuple[float, int, int]] = {}  # key -> (due at, seq, version)
        self.now = 0.0
        self.seq = 0

    def _schedule(self, key: int, at: float, version: int) -> None:
        self.seq += 1
        self.model[key] = (at, self.seq, version)

    @rule(keys=st.lists(KEYS, max_size=4, unique=True))
    def start(self, keys: list[int]) -> None:
        self.seq += 1
        version = self.seq
        self.leases.started([(k, (k, version)) for k in keys], self.now)
        for k in keys:
            self._schedule(k, self.now + KEEPALIVE_S, version)

    @rule(key=KEYS)
    def settle(self, key: int) -> None:
        expected = self.model.pop(key, None)
        got = self.leases.settle(key)
        assert got == (None if expected is None else (key, expected[2]))

    @rule(dt=st.one_of(st.floats(0, 12), st.just(KEEPALIVE_S)))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def due(self) -> None:
        got = self.leases.due(self.now)
        ready = sorted((at, seq, k) for k, (at, seq, _) in self.model.items() if at <= self.now)
        assert [k for k, _ in got] == [k for _, _, k in ready]
        for k, version in got:
            assert self.model[k][2] == version, "the item most recently started"
            self._schedule(k, self.now + KEEPALIVE_S, version)

    @precondition(lambda self: self.model)
    @rule()
    def take_all(self) -> None:
        got = self.leases.take_all()
        assert sorted(k for k, _ in got) == sorted(self.model)
        self.model.clear()

    @invariant()
    def same_members(self) -> None:
        assert len(self.leases) == len(self.model)
        assert sorted(k for k, _ in self.leases) == sorted(self.model)
        assert all(k in self.leases for k in self.model)


TestLeases = LeasesMachine.TestCase
TestLeases.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


# -- BatchCycle: scenario table -------------------------------------------------------------------


def batch(name: str, firsts: dict[str, int] | None = None) -> Batch[str, str]:
    """A batch whose messages are ``name`` + an index, e.g. batch("a") holds a0 and a1."""
    firsts = firsts if firsts is not None else {"p": ord(name) * 10}
    return Batch(
        messages=[f"{name}0", f"{name}1"],
        firsts=dict(firsts),
        commits={p: o + 2 for p, o in firsts.items()},
    )


def summary(actions: Actions[str, str]) -> tuple[list[str], list[str], dict[str, int], list[str]]:
    return (
        [b.messages[0][0] for b in actions.commit],
        actions.hand_out,
        actions.seek,
        actions.dropped,
    )


NONE: tuple[list[str], list[str], dict[str, int], list[str]] = ([], [], {}, [])

# Each row: the batches (name -> firsts), then steps: ("started", name, ok) or
# ("committed", name), each with the actions expected as (commit, hand_out, seek, dropped).
CYCLE_SCENARIOS: dict[str, tuple[dict[str, dict[str, int]], list[tuple[object, ...]]]] = {
    "one-batch": (
        {"a": {"p": 0}},
        [
            ("started", "a", True, (["a"], [], {}, [])),
            ("committed", "a", ([], ["a0", "a1"], {}, [])),
        ],
    ),
    "commit-waits-for-earlier-starts": (
        {"a": {"p": 0}, "b": {"p": 2}},
        [
            ("started", "b", True, NONE),
            ("started", "a", True, (["a", "b"], [], {}, [])),
            ("committed", "a", ([], ["a0", "a1"], {}, [])),
            ("committed", "b", ([], ["b0", "b1"], {}, [])),
        ],
    ),
    "pipelined-start-while-committing": (
        {"a": {"p": 0}, "b": {"p": 2}},
        [
            ("started", "a", True, (["a"], [], {}, [])),
            ("started", "b", True, (["b"], [], {}, [])),
            ("committed", "b", ([], ["b0", "b1"], {}, [])),
            ("committed", "a", ([], ["a0", "a1"], {}, [])),
        ],
    ),
    "hand-out-waits-for-the-commit": (
        {"a": {"p": 0}},
        [("started", "a", True, (["a"], [], {}, []))],
    ),
    "failed-start-drops-it-and-later-ones": (
        {"a": {"p": 0}, "b": {"p": 2}, "c": {"p": 4}},
        [
            ("started", "b", False, ([], [], {"p": 2}, ["b0", "b1", "c0", "c1"])),
            ("started", "c", True, NONE),  # already dropped: nothing
            ("started", "a", True, (["a"], [], {}, [])),
            ("committed", "a", ([], ["a0", "a1"], {}, [])),
        ],
    ),
    "failed-start-spares-batches-already-committing": (
        {"a": {"p": 0}, "b": {"p": 2}},
        [
            ("started", "a", True, (["a"], [], {}, [])),
            ("started", "b", False, ([], [], {"p": 2}, ["b0", "b1"])),
            ("committed", "a", ([], ["a0", "a1"], {}, [])),
        ],
    ),
    "failed-start-drops-later-started-ones-too": (
        {"a": {"p": 0}, "b": {"p": 2}},
        [
            ("started", "b", True, NONE),
            ("started", "a", False, ([], [], {"p": 0}, ["a0", "a1", "b0", "b1"])),
            ("committed", "b", NONE),
        ],
    ),
    "seek-to-the-smallest-first-offset-per-partition": (
        {"a": {"p": 5, "q": 9}, "b": {"q": 3, "r": 7}, "c": {"p": 8}},
        [("started", "a", False, ([], [], {"p": 5, "q": 3, "r": 7}, ["a0", "a1", "b0", "b1",
                                                                      "c0", "c1"]))],
    ),
    "unknown-batch-is-ignored": (
        {"a": {"p": 0}},
        [
            ("started", "a", True, (["a"], [], {}, [])),
            ("committed", "a", ([], ["a0", "a1"], {}, [])),
            ("committed", "a", NONE),
            ("started", "a", False, NONE),
        ],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("firsts", "steps"), CYCLE_SCENARIOS.values(), ids=CYCLE_SCENARIOS.keys())
def test_cycle_scenarios(
    firsts: dict[str, dict[str, int]], steps: list[tuple[object, ...]]
) -> None:
    cycle: BatchCycle[str, str] = BatchCycle()
    batches = {name: batch(name, f) for name, f in firsts.items()}
    for b in batches.values():
        cycle.add(b)
    assert len(cycle) == len(batches)
    assert cycle.messages == 2 * len(batches)
    for step in steps:
        match step:
            case ("started", str() as name, bool() as ok, expected):
                assert summary(cycle.started(batches[name], ok)) == expected, step
            case ("committed", str() as name, expected):
                assert summary(cycle.committed(batches[name])) == expected, step
            case _:
                raise AssertionError(step)


def test_batches_lists_what_is_in_flight_in_poll_order() -> None:
    cycle: BatchCycle[str, str] = BatchCycle()
    a, b = batch("a"), batch("b")
    cycle.add(a)
    cycle.add(b)
    assert cycle.batches() == [a, b]
    cycle.started(a, True)
    assert cycle.batches() == [a, b]
    cycle.committed(a)
    assert cycle.batches() == [b]
    cycle.started(b, False)
    assert cycle.batches() == [] and len(cycle) == 0 and cycle.messages == 0


def test_an_empty_batch_only_moves_offsets() -> None:
    cycle: BatchCycle[str, str] = BatchCycle()
    empty: Batch[str, str] = Batch([], {"p": 0}, {"p": 5})
    cycle.add(empty)
    started = cycle.started(empty, True)
    assert started.commit == [empty] and started.hand_out == [] and started.dropped == []
    committed = cycle.committed(empty)
    assert committed.hand_out == [] and committed.commit == [] and len(cycle) == 0


# -- BatchCycle: hypothesis -----------------------------------------------------------------------

PARTITIONS = ["p0", "p1", "p2"]


@dataclass
class Polled:
    """What the test knows of one polled batch."""

    index: int
    batch: Batch[str, str]
    start_acked: bool = False
    commit_issued: bool = False
    commit_over: bool = False
    dropped: bool = False
    handed_out: bool = False


@dataclass
class Log:
    """The consumer's read position per partition (it moves back on a seek)."""

    position: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTITIONS, 0))


class BatchCycleMachine(RuleBasedStateMachine):
    """The safety order, checked against whatever interleaving of acknowledgements,
    failures and commit completions hypothesis picks:

    * a batch's messages are handed out only after its START was acknowledged and its
      commit is over, and exactly once;
    * commits are issued in poll order, each once, only after the START of the batch and
      of every earlier batch still in the cycle was acknowledged;
    * a failed START drops that batch and every later batch whose commit was not issued,
      and seeks each of their partitions to the smallest first offset among them.
    """

    polled = Bundle("polled")

    def __init__(self) -> None:
        super().__init__()
        self.cycle: BatchCycle[str, str] = BatchCycle()
        self.log = Log()
        self.all: list[Polled] = []
        self.issued: list[int] = []  # poll indexes, in the order commits were issued
        self.handed: list[str] = []
        self.dropped: list[str] = []

    def live(self) -> list[Polled]:
        return [p for p in self.all if not p.dropped and not p.commit_over]

    @rule(
        target=polled,
        reads=st.dictionaries(st.sampled_from(PARTITIONS), st.integers(1, 4), min_size=1),
        ours=st.integers(0, 3),
    )
    def poll(self, reads: dict[str, int], ours: int) -> Polled:
        index = len(self.all)
        firsts = {p: self.log.position[p] for p in reads}
        commits = {p: self.log.position[p] + n for p, n in reads.items()}
        for p, n in reads.items():
            self.log.position[p] += n
        b: Batch[str, str] = Batch([f"m{index}.{i}" for i in range(ours)], firsts, commits)
        self.cycle.add(b)
        polled = Polled(index, b)
        self.all.append(polled)
        return polled

    def _apply(self, actions: Actions[str, str]) -> None:
        by_batch = {id(p.batch): p for p in self.all}
        for b in actions.commit:
            p = by_batch[id(b)]
            assert not p.commit_issued, "a commit is issued once"
            assert not p.dropped
            earlier = [q for q in self.all if q.index < p.index and not q.dropped]
            assert all(q.start_acked for q in [*earlier, p]), "START before commit, in order"
            assert all(q.commit_issued for q in earlier), "commits in poll order"
            p.commit_issued = True
            self.issued.append(p.index)
        if actions.dropped:
            assert actions.seek, "what is dropped is read again"
        for message in actions.dropped:
            assert message not in self.handed
            self.dropped.append(message)
        for partition, offset in actions.seek.items():
            self.log.position[partition] = offset
        self.handed.extend(actions.hand_out)

    @rule(p=polled, ok=st.booleans())
    def start_acknowledged(self, p: Polled, ok: bool) -> None:
        if p.start_acked or p.commit_over:
            return  # the consumer reports a flush once
        in_cycle = not p.dropped
        later = [q for q in self.all if q.index >= p.index and not q.dropped]
        actions = self.cycle.started(p.batch, ok)
        if not in_cycle:
            assert actions == Actions(), "a dropped batch's outcome changes nothing"
            return
        if ok:
            p.start_acked = True
            assert not actions.dropped and not actions.seek and not actions.hand_out
        else:
            assert not actions.commit and not actions.hand_out
            gone = [q for q in later if not q.commit_issued]
            assert actions.dropped == [m for q in gone for m in q.batch.messages]
            expected_seek: dict[str, int] = {}
            for q in gone:
                for partition, first in q.batch.firsts.items():
                    expected_seek[partition] = min(first, expected_seek.get(partition, first))
            assert actions.seek == expected_seek
            for q in gone:
                q.dropped = True
        self._apply(actions)

    @precondition(lambda self: any(p.commit_issued and not p.commit_over for p in self.all))
    @rule(i=st.integers(0, 100))
    def commit_over(self, i: int) -> None:
        waiting = [p for p in self.all if p.commit_issued and not p.commit_over]
        p = waiting[i % len(waiting)]
        actions = self.cycle.committed(p.batch)
        assert actions.hand_out == p.batch.messages
        assert not actions.commit and not actions.dropped and not actions.seek
        assert p.start_acked, "handed out only after its START was acknowledged"
        p.commit_over = p.handed_out = True
        self._apply(actions)

    @invariant()
    def cycle_holds_exactly_the_live_batches(self) -> None:
        assert [id(b) for b in self.cycle.batches()] == [id(p.batch) for p in self.live()]
        assert self.cycle.messages == sum(len(p.batch.messages) for p in self.live())

    @invariant()
    def commits_issued_in_poll_order(self) -> None:
        assert self.issued == sorted(self.issued)

    @invariant()
    def every_message_is_handed_out_or_dropped_at_most_once(self) -> None:
        assert len(set(self.handed)) == len(self.handed)
        assert not set(self.handed) & set(self.dropped)
        for p in self.all:
            if p.handed_out:
                assert p.start_acked and p.commit_issued and p.commit_over

    def teardown(self) -> None:
        """Acknowledge everything left: every message ends handed out or dropped."""
        for p in self.live():
            if not p.start_acked and not p.dropped:
                self.start_acknowledged(p, True)
        while any(p.commit_issued and not p.commit_over for p in self.all):
            self.commit_over(0)
        assert len(self.cycle) == 0
        polled = [m for p in self.all for m in p.batch.messages]
        assert sorted(self.handed + self.dropped) == sorted(polled)


TestBatchCycle = BatchCycleMachine.TestCase
TestBatchCycle.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
