"""Transactional consumer mode, with the tracker's transactional redelivery."""

from __future__ import annotations

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

import kmq
from kmq.markers import MarkerType
from tests.functional.conftest import Broker, Topics
from tests.functional.helpers import read_markers, wait_until
from tracker.daemon import Tracker
from tracker.redeliver import Redeliverer


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


def test_a_nudge_completes_a_transaction_left_prepared(broker: Broker, topics: Topics) -> None:
    """The embedded broker only prepares a transaction that ends while another one writing
    to the same partition is open (tracker.held): A's marker stays hidden from
    read_committed readers while B is open. A transaction of another producer writing
    only to A's markers partition (the tracker's nudge) completes A at once, B still open:
    after it, on any broker, A's marker reads back; B's copy once B commits."""
    boot = broker.bootstrap_servers
    made: list[KafkaProducer | KafkaConsumer] = []

    def producer(name: str) -> KafkaProducer:
        p = KafkaProducer(
            bootstrap_servers=boot,
            transactional_id=f"{topics.markers}.{name}",
            enable_idempotence=True,
            acks="all",
        )
        made.append(p)
        p.init_transactions()
        return p

    def reader(partition: int) -> tuple[KafkaConsumer, TopicPartition]:
        c = KafkaConsumer(
            bootstrap_servers=boot, isolation_level="read_committed", fetch_max_wait_ms=50
        )
        made.append(c)
        tp = TopicPartition(topics.markers, partition)
        c.assign([tp])
        c.seek_to_beginning(tp)
        return c, tp

    def read_until(c: KafkaConsumer, tp: TopicPartition, want: list[bytes]) -> None:
        read: list[bytes] = []

        def all_read() -> bool:
            read.extend(r.value for r in c.poll(100).get(tp, []))
            return len(read) >= len(want)

        wait_until(all_read, 10, f"{want} to be read back")
        assert read == want

    try:
        a, b, nudger = producer("a"), producer("b"), producer("nudge")
        a.begin_transaction()
        a.send(topics.markers, b"held", partition=0)
        a.send(topics.markers, b"a-copy", partition=1)
        a.flush()
        b.begin_transaction()
        b.send(topics.markers, b"b-copy", partition=1)
        b.flush()
        a.commit_transaction()
        nudge = Redeliverer(topics.queue, topics.retry, topics.markers, lambda t, q: (0, 1))
        assert nudge.nudge(nudger, 0, b"probe").written
        markers, tp = reader(0)
        read_until(markers, tp, [b"held", b"probe"])
        b.commit_transaction()
        copies, tp = reader(1)
        read_until(copies, tp, [b"a-copy", b"b-copy"])
    finally:
        for client in made:
            client.close()
