"""Reproduce, without kmq, the embedded broker's lost transaction.

``python -m bench.broker_txn_race [--tries N] [--overlap] [--bootstrap-servers HOST:PORT]``

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

With ``--overlap``, two producers each write to a partition of their own and to one
partition they share (what two tracker replicas' redelivery rounds do: each its own markers
partition, and a retry partition both send copies to), and their two EndTxn(commit)
requests go out at once (what a stall of every connection does to two rounds in flight:
chaos run 67). Tansu 0.6 lets one call finish both transactions while the other is still
writing its commit markers; those markers are recorded into the finished transaction, as
above.

Not a benchmark and not a test: it exists so that the cause can be shown, and re-checked
against a later broker release. Exit status 1 when the partitions got stuck.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.net.compat import KafkaNetClient
from kafka.protocol.old.end_txn import EndTxnRequest_v0

from bench.common import create_topics, new_tag, reproduce


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


def end_at_once(connections: list[tuple[Any, Any]], requests: list[Any]) -> list[object]:
    """Each request on its own connection, all released at once; their error codes."""
    answers: list[object] = []
    start = threading.Barrier(len(connections))

    def send(client: Any, node: Any, request: Any) -> None:
        start.wait()
        try:
            answers.append(client.send_and_receive(node, request, 5000).error_code)
        except Exception as exc:  # reported, not handled
            answers.append(repr(exc))

    threads = [
        threading.Thread(target=send, args=(*c, r))
        for c, r in zip(connections, requests, strict=True)
    ]
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


def commit_request(producer: Any, transactional_id: str) -> Any:
    """An EndTxn(commit) for ``producer``'s open transaction, sent by hand."""
    ids = producer._transaction_manager.producer_id_and_epoch
    return EndTxnRequest_v0(
        transactional_id=transactional_id,
        producer_id=ids.producer_id,
        producer_epoch=ids.epoch,
        committed=True,
    )


def run(servers: str, tries: int, overlap: bool = False) -> bool:
    """True when the partitions got stuck."""
    tag = new_tag()
    topics = [f"race-{tag}-a", f"race-{tag}-b"] + ([f"race-{tag}-c"] if overlap else [])
    create_topics(servers, dict.fromkeys(topics, 1))
    connections = [connection(servers), connection(servers)]
    for attempt in range(1, tries + 1):
        owners: list[Any] = []
        if overlap:  # a's partition is shared; b and c are each one's own
            ids = [f"{tag}-one-{attempt}", f"{tag}-two-{attempt}"]
            owners = [
                open_transaction(servers, ids[0], [topics[0], topics[1]]),
                open_transaction(servers, ids[1], [topics[0], topics[2]]),
            ]
            requests = [commit_request(p, i) for p, i in zip(owners, ids, strict=True)]
        else:  # one transaction, ended twice
            owners = [open_transaction(servers, f"{tag}-owner-{attempt}", topics)]
            requests = [commit_request(owners[0], f"{tag}-owner-{attempt}")] * 2
        answers = end_at_once(connections, requests)
        later = open_transaction(servers, f"{tag}-later-{attempt}", topics)
        later.commit_transaction()
        read = [reaches_end(servers, topic, 2.0) for topic in topics]
        print(f"try {attempt}: EndTxn answers {answers}; read_committed reached the end: "
              f"{[r[0] for r in read]} (position, high watermark: "
              f"{[r[1:] for r in read]})")  # fmt: skip
        for owner in owners:
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
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="end two overlapping transactions at once, not one transaction twice",
    )
    args = parser.parse_args(argv)
    return reproduce(args.bootstrap_servers, lambda servers: run(servers, args.tries, args.overlap))


if __name__ == "__main__":
    sys.exit(main())
