"""Max attempts, reject, dead-letter listing and replay, retry backoff, at-most-once mode."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from kafka.errors import CommitFailedError, KafkaTimeoutError

import kmq
from kmq.dlq import list_dead_letters, replay_dead_letters
from kmq.markers import MarkerType
from tests.functional.conftest import Broker, Topics
from tests.functional.helpers import read_markers, wait_until
from tracker.daemon import Tracker

FAST_RETRY = kmq.RetryPolicy(max_attempts=2, backoff_min_s=0.01, backoff_max_s=0.01)


def test_out_of_attempts_goes_to_the_dead_letter_queue(
    service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("jobs", policy=FAST_RETRY)
    sent = q.producer().send(b"poison", headers={"trace": b"t-9"})
    with q.consumer() as consumer:
        for attempt in (1, 2):
            msg = consumer.receive(timeout_s=15)
            assert msg is not None and (msg.id, msg.attempt) == (sent, attempt)
            msg.nack(reason=f"boom {attempt}")
        assert consumer.receive(timeout_s=2) is None  # no third attempt
    with service.queue("jobs.dlq").consumer() as dead:
        letter = dead.receive(timeout_s=15)
        assert letter is not None
        assert (letter.id, letter.payload, letter.attempt) == (sent, b"poison", 1)
        assert letter.headers["trace"] == b"t-9"
        assert letter.headers["kmq.dlq.origin"] == b"jobs"
        assert letter.headers["kmq.dlq.attempts"] == b"2"
        assert letter.headers["kmq.dlq.reason"] == b"boom 2"
        letter.ack()
    # A copy is readable before its round commits and counts it.
    wait_until(lambda: tracker.stats()["dead_letters"] == 1, 10, "the dead letter counted")
    assert tracker.stats()["redeliveries"] == 1


def test_reject_dead_letters_at_once_and_replay_brings_it_back(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("jobs")
    producer = q.producer()
    rejected = {producer.send(b"bad %d" % i) for i in range(3)}
    with q.consumer() as consumer:
        for _ in range(3):
            msg = consumer.receive(timeout_s=15)
            assert msg is not None
            msg.reject("schema mismatch")
        assert consumer.receive(timeout_s=2) is None
    letters = list_dead_letters(q)
    assert {d.message_id for d in letters} == rejected
    assert {(d.origin_queue, d.attempts, d.reason) for d in letters} == {
        ("jobs", 1, "schema mismatch")
    }
    assert replay_dead_letters(q, limit=2) == 2
    assert replay_dead_letters(q) == 1
    assert list_dead_letters(q) == []
    with q.consumer() as consumer:
        back = [consumer.receive(timeout_s=15) for _ in range(3)]
        assert all(m is not None for m in back)
        assert {m.id for m in back if m} == rejected
        assert {m.attempt for m in back if m} == {1}
        assert all("kmq.dlq.origin" not in m.headers for m in back if m)
        for m in back:
            assert m is not None
            m.ack()
    markers = read_markers(broker.bootstrap_servers, topics)
    dead = [m for m in markers if m.type is MarkerType.DEAD_LETTERED and m.queue == "jobs"]
    assert {m.message_id for m in dead} == rejected


def test_nack_without_delay_follows_the_queue_backoff(
    service: kmq.Service, tracker: Tracker
) -> None:
    policy = kmq.RetryPolicy(backoff_min_s=1.5, backoff_max_s=30.0)
    q = service.queue("slow", policy=policy)
    q.producer().send(b"x")
    with q.consumer(rng=lambda: 0.0) as consumer:  # rng 0: exactly the minimum
        msg = consumer.receive(timeout_s=15)
        assert msg is not None
        nacked = time.monotonic()
        msg.nack()
        again = consumer.receive(timeout_s=15)
        assert again is not None and again.attempt == 2
        assert time.monotonic() - nacked >= 1.5
        again.ack()


def test_at_most_once_never_redelivers_and_writes_no_markers(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("fire")
    sent = q.producer().send(b"once")
    with q.consumer(mode="at_most_once") as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None and msg.id == sent
        with pytest.raises(kmq.MessageStateError):
            msg.nack()
        # Dropped without ack: at-most-once, so it never comes back.
    with q.consumer() as other:
        assert other.receive(timeout_s=3) is None
    wait_until(lambda: tracker.wait_caught_up(1), 5, "tracker")
    assert [
        m for m in read_markers(broker.bootstrap_servers, topics) if m.queue == "fire"
    ] == []


@pytest.mark.parametrize("landed", [False, True], ids=["commit-lost", "answer-lost"])
def test_at_most_once_failed_commit_neither_loses_nor_doubles(
    service: kmq.Service, landed: bool
) -> None:
    """An offset commit that fails (not landed: the batch must be read again) or whose answer
    is lost (landed: the batch must be handed out, once) costs no message and doubles none."""
    q = service.queue("fire")
    with q.consumer(mode="at_most_once") as consumer:
        real_commit = consumer._kc.commit
        injected: list[Any] = []

        def flaky_commit(offsets: Any) -> None:
            if injected:
                return real_commit(offsets)  # type: ignore[no-any-return]
            injected.append(offsets)
            if landed:
                real_commit(offsets)
                raise KafkaTimeoutError("injected: the commit's answer was lost")
            raise CommitFailedError("injected: the commit failed")

        consumer._kc.commit = flaky_commit  # before anything is sent, so before any commit
        producer = q.producer()
        sent = [producer.send(b"%d" % i) for i in range(5)]
        got: Counter[str] = Counter()
        deadline = time.monotonic() + 20
        while sum(got.values()) < len(sent) and time.monotonic() < deadline:
            msg = consumer.receive(timeout_s=0.2)
            if msg is not None:
                got[msg.id] += 1
        assert injected, "the fault was never hit"
        assert consumer.receive(timeout_s=2) is None
    assert got == Counter(sent)
