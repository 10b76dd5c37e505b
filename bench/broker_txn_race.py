"""Reproduce, without kmq, the embedded broker's lost transaction.

``python -m bench.broker_txn_race [--tries N] [--bootstrap-servers HOST:PORT]``

One producer writes to two partitions in a transaction; two EndTxn(commit) requests for it
are then sent at once on two connections (what a client's retry of a commit, or a new
owner's claim rolling the transaction back, amounts to at the broker). Then another
producer commits a transaction on the same two partitions, and a read_committed reader
reads each partition from the start. On Apache Kafka, whose transaction coordinator answers
a second end of a transaction in progress with CONCURRENT_TRANSACTIONS, it should always
reach the high watermark (not run against one: this machine has no Kafka).
On Tansu 0.6 (the embedded broker) it stopped short, for good, within 2 to 21 tries in each
of six runs on a 2-core machine: Tansu finished the transaction in one call while the other
was still writing its commit markers, recorded those markers' offsets into the finished
transaction, and no later transaction overlapping them can finish again. That held chaos
runs 37 and 38's markers partitions and lost their messages (README, *Under chaos*).

Not a benchmark and not a test: it exists so that the cause can be shown, and re-checked
against a later broker release. Exit status 1 when the partitions got stuck.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import uuid
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.net.compat import KafkaNetClient
from kafka.protocol.old.end_txn import EndTxnRequest_v0

from kmq.dev.embedded import EmbeddedBroker


def reaches_end(servers: str, topic: str, timeout_s: float) -> tuple[bool, int, int | None]:
    """Whether a read_committed reader gets to partition 0's high watermark."""
    reader = KafkaConsumer(
        bootstrap_servers=servers, isolation_level="read_committed", enable_auto_commit=False
    )
    tp = TopicPartition(topic, 0)
    reader.assign([tp])
    reader.seek_to_beginning(tp)
    deadline = time.monotonic() + timeout_s
    highwater: int | None = None
    try:
        while time.monotonic() < deadline:
            reader.poll(100)
            highwater = reader.highwater(tp)
            if highwater is not None and reader.position(tp) >= highwater:
                return True, reader.position(tp), highwater
        return False, reader.position(tp), highwater
    finally:
        reader.close()


def connection(servers: str) -> tuple[Any, Any]:
    config = dict(KafkaProducer.DEFAULT_CONFIG)
    config["bootstrap_servers"] = servers
    client = KafkaNetClient(**config)
    node = client.least_loaded_node(bootstrap_fallback=True)
    client.await_ready(node)
    return client, node


def end_twice_at_once(connections: list[tuple[Any, Any]], request: Any) -> list[object]:
    answers: list[object] = []
    start = threading.Barrier(len(connections))

    def send(client: Any, node: Any) -> None:
        start.wait()
        try:
            answers.append(client.send_and_receive(node, request, 5000).error_code)
        except Exception as exc:  # reported, not handled
            answers.append(repr(exc))

    threads = [threading.Thread(target=send, args=c) for c in connections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return answers


def open_transaction(servers: str, transactional_id: str, topics: list[str]) -> Any:
    """A producer with a transaction begun and one record in partition 0 of each topic."""
    producer = KafkaProducer(bootstrap_servers=servers, transactional_id=transactional_id)
    producer.init_transactions()
    producer.begin_transaction()
    for topic in topics:
        producer.send(topic, transactional_id.encode(), partition=0)
    producer.flush()
    return producer


def run(servers: str, tries: int) -> bool:
    """True when the partitions got stuck."""
    tag = uuid.uuid4().hex[:8]
    topics = [f"race-{tag}-a", f"race-{tag}-b"]
    admin = KafkaAdminClient(bootstrap_servers=servers)
    admin.create_topics([NewTopic(t, 1, 1) for t in topics])
    admin.close()
    connections = [connection(servers), connection(servers)]
    for attempt in range(1, tries + 1):
        owner = open_transaction(servers, f"{tag}-owner-{attempt}", topics)
        ids = owner._transaction_manager.producer_id_and_epoch
        request = EndTxnRequest_v0(
            transactional_id=f"{tag}-owner-{attempt}",
            producer_id=ids.producer_id,
            producer_epoch=ids.epoch,
            committed=True,
        )
        answers = end_twice_at_once(connections, request)
        later = open_transaction(servers, f"{tag}-later-{attempt}", topics)
        later.commit_transaction()
        read = [reaches_end(servers, topic, 2.0) for topic in topics]
        print(f"try {attempt}: EndTxn answers {answers}; read_committed reached the end: "
              f"{[r[0] for r in read]} (position, high watermark: "
              f"{[r[1:] for r in read]})")  # fmt: skip
        owner.close(timeout=0.5)
        later.close(timeout=0.5)
        if not all(r[0] for r in read):
            time.sleep(3)
            again = [reaches_end(servers, topic, 2.0)[0] for topic in topics]
            print(f"stuck; 3 s later, reached the end: {again}")
            return True
    print(f"not stuck after {tries} tries")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=40)
    parser.add_argument("--bootstrap-servers", help="a running broker (default: embedded)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    if args.bootstrap_servers:
        return int(run(args.bootstrap_servers, args.tries))
    with EmbeddedBroker() as broker:
        return int(run(broker.bootstrap_servers, args.tries))


if __name__ == "__main__":
    sys.exit(main())
