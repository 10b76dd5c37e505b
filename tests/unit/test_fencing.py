"""tracker.fencing: one transactional producer per owned markers partition (stub producers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.errors import (
    InvalidProducerEpochError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
)

from kmq.errors import BrokerError
from tests.unit.kafka_stubs import StubTxnProducer
from tracker.fencing import (
    BUILD_RETRY_S,
    CLAIM_GIVE_UP_S,
    FENCED_ERRORS,
    FenceWatch,
    PartitionWriters,
    Tenure,
    is_fenced,
    transactional_id,
)


class Factory:
    """``make(transactional_id)`` for PartitionWriters: records every producer it builds.
    ``init_fails[txn_id]`` holds what each next init_transactions() of that id raises
    (``None``: it succeeds); ``make_fails`` what the next builds raise."""

    def __init__(self) -> None:
        self.made: list[StubTxnProducer] = []
        self.init_fails: dict[str, list[BaseException | None]] = {}
        self.make_fails: list[BaseException] = []

    def __call__(self, txn_id: str) -> StubTxnProducer:
        if self.make_fails:
            raise self.make_fails.pop(0)
        queued = self.init_fails.get(txn_id)
        exc = queued.pop(0) if queued else None
        producer = StubTxnProducer(txn_id, fail={"init_transactions": exc} if exc else {})
        self.made.append(producer)
        return producer


def writers(factory: Factory) -> PartitionWriters:
    return PartitionWriters(factory, "grp", "markers")


@pytest.mark.parametrize(
    ("group", "topic", "partition", "expected"),
    [
        ("kmq-tracker", "kmq.markers", 0, "kmq-tracker.kmq.markers.0"),
        ("g", "m", 17, "g.m.17"),
        ("team.a", "q.markers", 3, "team.a.q.markers.3"),
    ],
    ids=["defaults", "short", "dotted-names"],
)
def test_transactional_id_names_the_partition(
    group: str, topic: str, partition: int, expected: str
) -> None:
    assert transactional_id(group, topic, partition) == expected


@pytest.mark.parametrize(
    ("exc", "fenced"),
    [
        (ProducerFencedError(), True),
        (InvalidProducerEpochError(), True),
        (KafkaTimeoutError("slow"), False),
        (KafkaConnectionError("down"), False),
        (KafkaError("other"), False),
        (ValueError("not kafka"), False),
        (KafkaError("Cannot perform send because ...", ProducerFencedError()), True),
        (KafkaError(f"... in an error state: {ProducerFencedError()}"), True),
        (KafkaError(f"... in an error state: {InvalidProducerEpochError()}"), True),
        (KafkaError(f"... in an error state: {KafkaTimeoutError()}"), False),
        (ValueError("ProducerFencedError"), False),
    ],
    ids=[
        "producer-fenced",
        "invalid-epoch",
        "timeout",
        "connection",
        "kafka-error",
        "value-error",
        "send-in-error-state",
        "fenced-error-state",
        "epoch-error-state",
        "other-error-state",
        "not-kafka-text",
    ],
)
def test_is_fenced(exc: BaseException, fenced: bool) -> None:
    assert is_fenced(exc) is fenced
    assert fenced or not isinstance(exc, FENCED_ERRORS)


def test_claim_initialises_a_producer_named_for_the_partition() -> None:
    factory = Factory()
    w = writers(factory)
    assert w.claimed() == set() and w.get(2) is None
    assert w.claim(2) is True
    [producer] = factory.made
    assert producer.transactional_id == "grp.markers.2"
    assert producer.calls == ["init_transactions"]
    assert w.get(2) is producer and w.claimed() == {2}
    assert w.get(3) is None


def test_claiming_again_keeps_the_producer() -> None:
    factory = Factory()
    w = writers(factory)
    assert w.claim(1) and w.claim(1)
    assert len(factory.made) == 1
    assert factory.made[0].calls == ["init_transactions"], "the epoch is bumped once"


@pytest.mark.parametrize(
    "exc", [KafkaConnectionError("down"), ProducerFencedError()], ids=["connection", "fenced"]
)
def test_a_failed_claim_keeps_nothing_and_can_be_retried(exc: KafkaError) -> None:
    factory = Factory()
    factory.init_fails["grp.markers.4"] = [exc, None]
    w = writers(factory)
    assert w.claim(4) is False
    assert w.get(4) is None and w.claimed() == set()
    [failed] = factory.made
    assert failed.closed_with == [1], "the half-made producer is closed"
    assert w.claim(4) is True
    assert len(factory.made) == 2
    assert w.get(4) is factory.made[1] is not failed
    assert factory.made[1].closed_with == []


def test_an_unanswered_claim_goes_on_waiting_for_the_same_request() -> None:
    """A claim the broker has not answered within the wait returns False at once, keeps its
    producer, and the next claim waits on for that producer's request (kafka-python goes on
    with the same InitProducerId after a timeout) instead of starting another."""
    factory = Factory()
    factory.init_fails["grp.markers.4"] = [KafkaTimeoutError()]
    w = writers(factory)
    assert w.claim(4) is False and w.claim(4) is False
    [producer] = factory.made
    assert w.get(4) is None and w.claimed() == set()
    assert producer.calls == ["init_transactions", "init_transactions"]
    assert producer.closed_with == [], "kept for the next claim"
    producer.fail = {}
    assert w.claim(4) is True and w.get(4) is producer
    assert producer.calls == ["init_transactions"] * 3


def test_a_claim_unanswered_for_long_is_given_up_for_a_new_producer() -> None:
    """A claim request lost with its connection is never answered: after CLAIM_GIVE_UP_S
    its producer is closed and the next claim builds another, whose claim succeeds."""
    factory = Factory()
    factory.init_fails["grp.markers.4"] = [KafkaTimeoutError()]
    now = [100.0]
    w = PartitionWriters(factory, "grp", "markers", clock=lambda: now[0])
    assert w.claim(4) is False
    [first] = factory.made
    now[0] += CLAIM_GIVE_UP_S - 0.1
    assert w.claim(4) is False and factory.made == [first], "still waited on"
    now[0] += 0.1
    assert w.claim(4) is True
    [_, second] = factory.made
    assert w.get(4) is second and first.closed_with == [0]
    assert first.calls == ["init_transactions", "init_transactions", "close"]


class SlowBroker:
    """``init(producer, wait_s)`` against a broker that answers each producer's
    InitProducerId ``latency_s`` after its first init sent it; the clock moves as a real
    wait would (to the answer, or by ``wait_s`` when it comes later)."""

    def __init__(self, latency_s: float) -> None:
        self.now = 100.0
        self.latency_s = latency_s
        self.sent: dict[str, float] = {}
        self.waits: list[tuple[str, float]] = []

    def init(self, producer: StubTxnProducer, wait_s: float) -> None:
        txn_id = producer.transactional_id
        self.waits.append((txn_id, wait_s))
        answered_at = self.sent.setdefault(txn_id, self.now) + self.latency_s
        if answered_at <= self.now + wait_s:
            self.now = max(self.now, answered_at)
            return
        self.now += wait_s
        raise KafkaTimeoutError()

    def writers(self) -> PartitionWriters:
        return PartitionWriters(
            Factory(), "grp", "markers", init=self.init, clock=lambda: self.now, wait_s=0.5
        )


@pytest.mark.parametrize(
    ("latency_s", "first_claimed", "held_s"),
    [
        (0.0, {1, 2, 3}, 0.0),
        (0.2, {1, 2, 3}, 0.2),  # one by one: 0.6 s
        (0.5, {1, 2, 3}, 0.5),  # one by one: 1.5 s
        (0.8, set(), 0.5),  # one by one: 1.5 s, and nothing claimed either
    ],
)
def test_claim_many_waits_once_for_all_its_claims(
    latency_s: float, first_claimed: set[int], held_s: float
) -> None:
    """A replica taking over several partitions sends every claim, then waits for them
    together: the loop is held up for one claim's wait, not one per partition."""
    broker = SlowBroker(latency_s)
    w = broker.writers()
    assert w.claim_many([1, 2, 3]) == first_claimed
    assert broker.now - 100.0 == pytest.approx(held_s)
    assert set(broker.sent) == {"grp.markers.1", "grp.markers.2", "grp.markers.3"}
    assert {wait for _, wait in broker.waits[:3]} == {0.0}, "sent without waiting first"
    # Unanswered ones are waited for again (the same requests) by the next call.
    assert w.claim_many([3, 2, 1]) == {1, 2, 3} - first_claimed
    assert w.claimed() == {1, 2, 3}
    assert broker.now - 100.0 == pytest.approx(max(held_s, latency_s))


def test_claim_many_of_one_partition_is_a_claim() -> None:
    broker = SlowBroker(0.2)
    w = broker.writers()
    assert w.claim_many([4, 4]) == {4}
    assert broker.waits == [("grp.markers.4", 0.5)], "no send-only pass for one claim"


def test_claim_many_leaves_claimed_partitions_alone() -> None:
    broker = SlowBroker(0.0)
    w = broker.writers()
    assert w.claim(1)
    broker.waits.clear()
    assert w.claim_many([1, 2]) == {2}
    assert [txn_id for txn_id, _ in broker.waits] == ["grp.markers.2"]


def test_an_unanswered_claim_is_logged_once_and_not_when_only_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = SlowBroker(10.0)
    w = broker.writers()
    with caplog.at_level("DEBUG", logger="kmq.tracker"):
        w.claim_many([1, 2])
        w.claim_many([1, 2])
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 2 and all("not answered yet" in m for m in warned), warned
    assert {"grp.markers.1" in m for m in warned} == {True, False}


def test_release_closes_an_unanswered_claim() -> None:
    factory = Factory()
    factory.init_fails["grp.markers.1"] = [KafkaTimeoutError()]
    w = writers(factory)
    assert w.claim(1) is False
    [pending] = factory.made
    w.release(1, timeout_s=0.0)
    assert pending.closed_with == [0.0]
    assert w.claim(1) is True and w.get(1) is factory.made[1] is not pending


@pytest.mark.parametrize(
    "exc",
    # kmq.kafka_clients.producer, the daemon's builder, turns kafka-python's failure to
    # reach the cluster in time into a BrokerError.
    [KafkaConnectionError("no brokers"), BrokerError("cannot connect to Kafka")],
    ids=["kafka-error", "broker-error"],
)
def test_a_claim_whose_producer_cannot_be_built_keeps_nothing(exc: Exception) -> None:
    """Nor does any claim that needs a new producer try again for BUILD_RETRY_S: each try
    can hold the tracker's loop up to the build's timeout while Kafka cannot be reached."""
    factory = Factory()
    factory.make_fails.append(exc)
    now = [100.0]
    w = PartitionWriters(factory, "grp", "markers", clock=lambda: now[0])
    assert w.claim(0) is False
    assert factory.made == [] and w.claimed() == set()
    now[0] += BUILD_RETRY_S - 0.001
    assert w.claim(0) is False and w.claim(1) is False
    assert factory.made == [], "not built again yet, for no partition"
    now[0] += 0.001
    assert w.claim(0) is True and w.claimed() == {0}


def test_a_failing_close_after_a_failed_claim_is_swallowed() -> None:
    def make(txn_id: str) -> StubTxnProducer:
        return StubTxnProducer(
            txn_id,
            fail={"init_transactions": KafkaConnectionError("x"), "close": RuntimeError("y")},
        )

    w = PartitionWriters(make, "grp", "markers")
    assert w.claim(0) is False
    assert w.claimed() == set()


def test_release_closes_and_forgets_only_that_partition() -> None:
    factory = Factory()
    w = writers(factory)
    assert w.claim(0) and w.claim(1)
    p0, p1 = factory.made
    w.release(0, timeout_s=2.5)
    assert p0.closed_with == [2.5] and p1.closed_with == []
    assert w.get(0) is None and w.get(1) is p1 and w.claimed() == {1}
    w.release(0)
    w.release(9)  # never claimed
    assert p0.closed_with == [2.5], "closed once"
    assert w.claim(0) and w.get(0) is factory.made[2], "a later claim starts afresh"


def test_release_forgets_a_producer_whose_close_fails() -> None:
    w = PartitionWriters(
        lambda txn_id: StubTxnProducer(txn_id, fail={"close": KafkaTimeoutError("x")}),
        "grp",
        "markers",
    )
    assert w.claim(5)
    w.release(5)
    assert w.claimed() == set() and w.get(5) is None


def test_close_releases_every_partition() -> None:
    factory = Factory()
    w = writers(factory)
    for partition in (3, 1, 2):
        assert w.claim(partition)
    w.close(timeout_s=0.5)
    assert w.claimed() == set()
    assert [p.closed_with for p in factory.made] == [[0.5]] * 3


def test_claimed_is_a_copy() -> None:
    factory = Factory()
    w = writers(factory)
    assert w.claim(1)
    w.claimed().add(7)
    assert w.claimed() == {1} and w.get(7) is None


OPS = st.lists(
    st.tuples(st.sampled_from(["claim", "claim-fails", "release"]), st.integers(0, 3)),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_claimed_is_what_succeeded_and_was_not_released(ops: list[tuple[str, int]]) -> None:
    factory = Factory()
    w = writers(factory)
    model: set[int] = set()
    for op, partition in ops:
        if op == "release":
            w.release(partition)
            model.discard(partition)
            continue
        if op == "claim-fails":
            factory.init_fails.setdefault(f"grp.markers.{partition}", []).append(
                KafkaConnectionError("x")  # (a timeout keeps its producer: tested above)
            )
        before = len(factory.made)
        ok = w.claim(partition)
        if partition in model:
            assert ok and len(factory.made) == before, "already claimed: nothing new"
            factory.init_fails.pop(f"grp.markers.{partition}", None)
        else:
            assert ok is (op == "claim")
        if ok:
            model.add(partition)
        assert w.claimed() == model
    open_ = {p.transactional_id for p in factory.made if not p.closed_with}
    assert open_ == {f"grp.markers.{p}" for p in model}, "every producer not kept is closed"
    w.close()
    assert all(p.closed_with for p in factory.made)


# -- FenceWatch: when a fenced partition comes back to this replica --------------------------

# Each step: (partitions assigned here, generation, stable) -> what retake() returns.
RETAKE_CASES = {
    "same generation never": [({1}, 5, True, []), ({1}, 5, True, []), ({1}, 5, True, [])],
    "later generation, seen twice": [({1}, 6, True, []), ({1}, 6, True, [1])],
    "not while rebalancing": [
        ({1}, 6, False, []),
        ({1}, 6, False, []),
        ({1}, 6, True, []),
        ({1}, 6, True, [1]),
    ],
    "a generation that moves on starts over": [
        ({1}, 6, True, []),
        ({1}, 7, True, []),
        ({1}, 7, True, [1]),
    ],
    "revoked: forgotten for good": [(set(), 6, True, []), ({1}, 7, True, []), ({1}, 7, True, [])],
    "only once": [({1}, 6, True, []), ({1}, 6, True, [1]), ({1}, 6, True, [])],
}


@pytest.mark.parametrize("steps", RETAKE_CASES.values(), ids=RETAKE_CASES.keys())
def test_a_fenced_partition_is_retaken_only_when_a_later_generation_keeps_it_here(
    steps: list[tuple[set[int], int, bool, list[int]]],
) -> None:
    watch = FenceWatch()
    watch.fenced(1, generation=5)
    for i, (assigned, generation, stable, expected) in enumerate(steps):
        assert watch.retake(assigned, generation, stable) == expected, f"step {i}"


# Each step: (assigned here, generation, stable, now) -> what retake() returns; settle 3 s,
# fenced at 10.0 in generation 5.
SETTLE_CASES = {
    "the same generation, stable for the session": [
        ({1}, 5, True, 11.0, []), ({1}, 5, True, 12.9, []), ({1}, 5, True, 13.0, [1]),
        ({1}, 5, True, 20.0, []),
    ],
    "unsettled: the wait starts over": [
        ({1}, 5, True, 12.0, []), ({1}, 5, False, 12.5, []), ({1}, 5, True, 15.0, []),
        ({1}, 5, True, 15.5, [1]),
    ],
    "a later generation: as before": [({1}, 6, True, 10.5, []), ({1}, 6, True, 10.6, [1])],
    "a zombie's generation ends: never in it": [
        ({1}, 5, True, 11.0, []), ({1}, -1, False, 11.5, []), ({1}, 7, False, 14.0, []),
        ({1}, 5, True, 14.1, []),
    ],
    "moved away: forgotten": [(set(), 5, True, 13.0, []), ({1}, 5, True, 20.0, [])],
}  # fmt: skip


@pytest.mark.parametrize("steps", SETTLE_CASES.values(), ids=SETTLE_CASES.keys())
def test_a_partition_fenced_by_an_adopter_is_retaken_once_its_generation_has_settled(
    steps: list[tuple[set[int], int, bool, float, list[int]]],
) -> None:
    watch = FenceWatch(settle_s=3.0)
    watch.fenced(1, generation=5, now=10.0)
    for i, (assigned, generation, stable, now, expected) in enumerate(steps):
        assert watch.retake(assigned, generation, stable, now) == expected, f"step {i}"


# (assigned here, generation, stable, now, held by another live replica) -> retake();
# settle 3 s, fenced at 10.0 in generation 5.
ADOPTER_CASES = {
    "left to a live adopter, then taken once it lets go": [
        ({1}, 5, True, 13.0, {1}, []), ({1}, 5, True, 30.0, {1}, []),
        ({1}, 5, True, 30.1, set(), [1]),
    ],
    "other partitions held elsewhere change nothing": [({1}, 5, True, 13.0, {2}, [1])],
    "a later generation keeps it here all the same": [
        ({1}, 6, True, 10.5, {1}, []), ({1}, 6, True, 10.6, {1}, [1]),
    ],
}  # fmt: skip


@pytest.mark.parametrize("steps", ADOPTER_CASES.values(), ids=ADOPTER_CASES.keys())
def test_a_partition_a_live_adopter_holds_is_left_to_it_in_the_generation_of_the_fence(
    steps: list[tuple[set[int], int, bool, float, set[int], list[int]]],
) -> None:
    watch = FenceWatch(settle_s=3.0)
    watch.fenced(1, generation=5, now=10.0)
    for i, (assigned, generation, stable, now, elsewhere, expected) in enumerate(steps):
        assert watch.retake(assigned, generation, stable, now, elsewhere) == expected, i


def test_an_assignment_ends_the_watch_and_a_new_fence_restarts_it() -> None:
    watch = FenceWatch()
    watch.fenced(1, generation=5)
    watch.fenced(2, generation=5)
    assert watch.retake({1, 2}, 6, True) == []
    watch.forget(1)  # the listener assigned it afresh: the daemon has it again
    watch.fenced(2, generation=6)  # fenced again in the generation seen once
    assert watch.watching() == {2}
    assert watch.retake({1, 2}, 6, True) == []
    assert watch.retake({1, 2}, 7, True) == []
    assert watch.retake({1, 2}, 7, True) == [2]
    assert watch.watching() == set()


TENURE_CASES = [
    # (held in generation, assigned again in generation, claim stands)
    (4, 5, True),  # the very next generation: nobody else was given it in between
    (4, 6, False),  # a generation between, missed or not: another may have claimed it
    (5, 5, False),  # not the next one
    (None, 5, False),  # never held (or forgotten)
    (4, None, False),  # the generation is not known
    (-1, 0, False),  # no generation (kafka-python's -1) is never a tenure
]


@pytest.mark.parametrize(("held", "assigned", "stands"), TENURE_CASES)
def test_a_kept_partitions_claim_stands_only_into_the_very_next_generation(
    held: int | None, assigned: int | None, stands: bool
) -> None:
    tenure = Tenure()
    if held is not None:
        tenure.held([3], held)
    assert tenure.unbroken({3}, assigned) == ({3} if stands else set())


def test_a_forgotten_partition_has_no_tenure() -> None:
    tenure = Tenure()
    tenure.held([1, 2], 7)
    tenure.forget(1)
    tenure.forget(9)  # never held: nothing happens
    assert tenure.unbroken({1, 2}, 8) == {2}


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 6)), max_size=12), st.integers(-1, 8))
def test_a_claim_stands_exactly_when_the_last_tenure_is_the_generation_before(
    helds: list[tuple[int, int]], generation: int
) -> None:
    tenure, last = Tenure(), {}
    for partition, gen in helds:
        tenure.held([partition], gen)
        last[partition] = gen
    expected = {p for p, g in last.items() if generation >= 1 and g == generation - 1}
    assert tenure.unbroken(range(4), generation) == expected
