"""Transactional consumer mode, with the tracker's transactional redelivery."""

from __future__ import annotations

from kafka import KafkaProducer

import kmq
from kmq.markers import MarkerType
from tests.functional.conftest import Broker, Topics
from tests.functional.helpers import read_markers, wait_until
from tracker.daemon import Tracker


def test_transactional_consumer_starts_and_commits_atomically(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("tx")
    producer = q.producer()
    sent = [producer.send(b"%d" % i) for i in range(5)]
    with q.consumer(transactional=True) as consumer:
        got = [consumer.receive(timeout_s=15) for _ in sent]
        assert all(m is not None for m in got)
        assert sorted(m.id for m in got if m) == sorted(sent)
        first = got[0]
        assert first is not None
        first.nack(delay_s=0)
        for m in got[1:]:
            assert m is not None
            m.ack()
        again = consumer.receive(timeout_s=10)
        assert again is not None and (again.id, again.attempt) == (first.id, 2)
        again.ack()
        assert consumer.receive(timeout_s=2) is None
    # The transactional consumer's queue offsets are committed: a new consumer gets nothing.
    with q.consumer() as later:
        assert later.receive(timeout_s=3) is None
    markers = read_markers(broker.bootstrap_servers, topics)
    starts = [m for m in markers if m.type is MarkerType.START]
    assert len(starts) == 6
    redelivered = [m for m in markers if m.type is MarkerType.REDELIVERED]
    assert [m.message_id for m in redelivered] == [first.id]
    wait_until(lambda: tracker.stats()["end"] == 5, 10, "the ENDs to reach the tracker")
    assert tracker.stats()["redeliveries"] == 1
    assert tracker.stats()["in_flight"] == 0


def test_a_transactional_consumer_whose_producer_is_fenced_goes_on_with_a_new_one(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    """The broker bumps a transactional id's epoch when its transaction outlives the
    transaction timeout, or when another producer inits that id: the old producer is
    fenced, and kafka-python's is unusable for good. The consumer must renew it (under the
    same id) and go on delivering, not fail every later batch."""
    q = service.queue("txfence")
    producer = q.producer()
    with q.consumer(transactional=True) as consumer:
        first = producer.send(b"before")
        got = consumer.receive(timeout_s=15)
        assert got is not None and got.id == first
        got.ack()
        fencer = KafkaProducer(
            bootstrap_servers=broker.bootstrap_servers,
            transactional_id=consumer._txn_id,
        )
        try:
            fencer.init_transactions()
        finally:
            fencer.close()
        sent = [producer.send(b"after %d" % i) for i in range(3)]
        taken = [consumer.receive(timeout_s=20) for _ in sent]
        assert sorted(m.id for m in taken if m is not None) == sorted(sent)
        for m in taken:
            assert m is not None
            m.ack()
    markers = read_markers(broker.bootstrap_servers, topics)
    started = [m.message_id for m in markers if m.type is MarkerType.START]
    assert sorted(started) == sorted([first, *sent]), "each started once, committed"
