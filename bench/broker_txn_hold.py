"""Reproduce, without kmq, how the embedded broker holds a transaction's partitions behind
an abandoned one that shares a partition with it.

``python -m bench.broker_txn_hold [--shared | --disjoint] [--bootstrap-servers HOST:PORT]``

A producer (in a child process) begins a transaction on partition 0 of topics ``m`` and
``r`` and is SIGKILLed with it open: a tracker replica killed inside a redelivery round.
A second producer then commits a transaction on ``m`` partition 1 and, with ``--shared``
(the default), ``r`` partition 0 (``--disjoint``: ``r`` partition 1), and a plain producer
keeps writing to ``m`` partition 1, which a read_committed reader reads. After 6 s the
first transactional id is claimed again (InitProducerId), which ends the open transaction.

On Apache Kafka the reader should never be held: the open transaction is on neither of
its partitions (not run against one: this machine has no Kafka). On Tansu 0.6 it read
nothing of ``m`` partition 1 until the claim with ``--shared`` (five runs of five), and
read on with ``--disjoint`` (two of two; 2026-12-03, this script and the one it came
from). Tansu finishes no transaction that overlaps one still open, and aborts no
abandoned one. That is how a tracker killed in the middle of a round held its survivors'
reading in the chaos runs (README, *Reading past a hold*).

Not a benchmark and not a test: it exists so that the cause can be shown, and re-checked
against a later broker release. Exit status 1 when the reader was held.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from bench.common import create_topics, new_tag, reproduce

_OPEN = """
import sys, time
from kafka import KafkaProducer
servers, txn_id, m, r = sys.argv[1:5]
p = KafkaProducer(bootstrap_servers=servers, transactional_id=txn_id, acks="all")
p.init_transactions()
p.begin_transaction()
p.send(m, b"open", partition=0)
p.send(r, b"open", partition=0)
p.flush()
print("open", flush=True)
time.sleep(600)
"""

CLAIM_AFTER_S = 6.0


def run(servers: str, shared: bool) -> bool:
    """Whether the reader was held until the claim."""
    tag = new_tag()
    m, r, abandoned = f"hold-m-{tag}", f"hold-r-{tag}", f"hold-x-{tag}"
    create_topics(servers, {m: 2, r: 2})
    child = subprocess.Popen(
        [sys.executable, "-c", _OPEN, servers, abandoned, m, r], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "open":
        raise SystemExit("the abandoned transaction was not opened")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    committed = KafkaProducer(bootstrap_servers=servers, transactional_id=f"hold-y-{tag}")
    committed.init_transactions()
    committed.begin_transaction()
    committed.send(m, b"y", partition=1)
    committed.send(r, b"y", partition=0 if shared else 1)
    committed.commit_transaction()
    plain = KafkaProducer(bootstrap_servers=servers, acks="all")
    reader = KafkaConsumer(
        bootstrap_servers=servers, isolation_level="read_committed", enable_auto_commit=False
    )
    tp = TopicPartition(m, 1)
    reader.assign([tp])
    reader.seek_to_beginning(tp)
    began = time.monotonic()
    read_before_claim = 0
    claimed = False
    while time.monotonic() - began < CLAIM_AFTER_S + 3:
        plain.send(m, b"tick", partition=1).get(timeout=10)
        read = sum(len(batch) for batch in reader.poll(timeout_ms=250).values())
        if not claimed:
            read_before_claim += read
            if time.monotonic() - began >= CLAIM_AFTER_S:
                again = KafkaProducer(bootstrap_servers=servers, transactional_id=abandoned)
                again.init_transactions()
                again.close()
                claimed = True
                print(f"before the claim: {read_before_claim} records read of "
                      f"{reader.highwater(tp)} written")  # fmt: skip
    print(f"after it: position {reader.position(tp)}, high watermark {reader.highwater(tp)}")
    for client in (committed, plain, reader):
        client.close()
    return read_before_claim == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--shared", action="store_true", default=True)
    group.add_argument("--disjoint", action="store_true")
    parser.add_argument("--bootstrap-servers", help="a running broker (default: embedded)")
    args = parser.parse_args(argv)
    return reproduce(args.bootstrap_servers, lambda servers: run(servers, not args.disjoint))


if __name__ == "__main__":
    sys.exit(main())
