"""Reproduce, without kmq, how the embedded broker answers the commit of a fenced producer.

``python -m bench.broker_fenced_commit [--bootstrap-servers HOST:PORT]``

A transactional producer writes a record in a transaction; a second producer with the same
transactional id then claims it (InitProducerId), which fences the first; the first then
commits. Apache Kafka answers that EndTxn with a fencing error (not run against one: this
machine has no Kafka). On Tansu 0.6 the broker closed the connection instead, and
kafka-python 3.0.12 found the coordinator again and sent the EndTxn again, without end: the
commit was not answered in 8 s (three runs of three, 2026-12-07). A produce or an offset
commit from the fenced producer is answered with the error at once.

For kmq this is a tracker whose partition is claimed by another replica after its round's
last write and before its commit (a fenced write or offset commit fails at once): on the
embedded broker that round waits out its whole bound (``tracker.redeliver.TXN_TIMEOUT_S``)
as stuck, rather than learning at once that it was fenced.

Not a benchmark and not a test: it exists so that the cause can be shown, and re-checked
against a later broker release. Exit status 1 when the commit went unanswered.
"""

from __future__ import annotations

import argparse
import sys
import time

from kafka import KafkaProducer
from kafka.errors import KafkaError

from bench.common import create_topics, new_tag, reproduce
from kmq import txn_wait
from kmq.kafka_clients import close_producer

WAIT_S = 8.0


def run(servers: str) -> bool:
    """Whether the fenced producer's commit went unanswered for :data:`WAIT_S`."""
    tag = new_tag()
    topic, txn_id = f"fenced-{tag}", f"fenced-{tag}"
    create_topics(servers, {topic: 1})
    first = KafkaProducer(bootstrap_servers=servers, transactional_id=txn_id, acks="all")
    first.init_transactions()
    first.begin_transaction()
    first.send(topic, b"first", partition=0).get(timeout=10)
    second = KafkaProducer(bootstrap_servers=servers, transactional_id=txn_id, acks="all")
    second.init_transactions()  # fences the first
    began = time.monotonic()
    unanswered = False
    try:
        txn_wait.commit(first, WAIT_S)
        print(f"the fenced commit succeeded in {time.monotonic() - began:.2f} s")
    except txn_wait.TransactionStuck:
        unanswered = True
        print(f"the fenced commit was not answered in {WAIT_S:g} s")
    except KafkaError as exc:
        print(f"the fenced commit failed in {time.monotonic() - began:.2f} s: {exc!r}")
    second.close()
    close_producer(first, 0)  # its EndTxn may still be retried
    return unanswered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="a running broker (default: embedded)")
    args = parser.parse_args(argv)
    return reproduce(args.bootstrap_servers, run)


if __name__ == "__main__":
    sys.exit(main())
