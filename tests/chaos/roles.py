"""The chaos suite's worker and producer processes (started through :mod:`tests.chaos.worker`).

Each process appends one JSON object per line to its own ledger file, flushed line by line
so a SIGKILL loses at most the line being written. Every line has ``e`` (the event) and
``t`` (the real wall time, unaffected by ``--clock-skew-s``):

- producer: ``sent`` (``id``, ``q``, ``n``) once ``send()`` returned; ``send_failed`` (``q``,
  ``n``, ``err``) when it raised (the message is retried under a new id, up to 5 times);
  ``gave_up`` (``q``, ``n``) after the last failure.
- worker: ``took`` (``id``, ``q``, ``a`` attempt, ``p``/``o`` the queue-topic record) when
  ``receive()`` handed a message over; ``acked`` / ``nacked`` once ``ack()`` / ``nack()``
  returned; ``ack_failed`` / ``nack_failed`` (``err``) when they raised.

A worker runs until it is killed; a consumer loop that fails makes it exit with code 3, which
the suite reports as a crash.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path

from kmq.consumer import Consumer
from kmq.errors import BrokerError
from kmq.service import Service
from tests.chaos.clock import real_time

NACK_REASON = "chaos nack"
"""The reason workers give when they nack; the tracker copies it onto REDELIVERED markers."""
SEND_TRIES = 5
CRASH_EXIT_CODE = 3


class Ledger:
    """An append-only JSON-lines file, safe to write from several threads."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, event: str, **fields: object) -> None:
        line = json.dumps({"e": event, "t": real_time(), **fields}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.worker")
    roles = parser.add_subparsers(dest="role", required=True)
    for role in ("worker", "producer"):
        sub = roles.add_parser(role)
        sub.add_argument("--bootstrap-servers", required=True)
        sub.add_argument("--queue-topic", required=True)
        sub.add_argument("--marker-topic", required=True)
        sub.add_argument("--queues", required=True, help="comma-separated queue ids")
        sub.add_argument("--name", required=True)
        sub.add_argument("--ledger", type=Path, required=True)
        sub.add_argument("--seed", default="0")
        sub.add_argument("--clock-skew-s", type=float, default=0.0, help="applied by the entry")
        sub.add_argument("--redelivery-timeout-s", type=float, default=2.0)
        sub.add_argument("--session-timeout-ms", type=int, default=2000)
    worker = roles.choices["worker"]
    worker.add_argument("--max-in-flight", type=int, default=10)
    worker.add_argument("--nack-probability", type=float, default=0.03)
    worker.add_argument("--max-work-ms", type=float, default=60.0)
    worker.add_argument(
        "--handlers", type=int, default=1, help="threads receiving from each queue's consumer"
    )
    producer = roles.choices["producer"]
    producer.add_argument("--count", type=int, required=True)
    producer.add_argument("--rate", type=float, required=True, help="messages per second, at most")
    producer.add_argument("--threads", type=int, default=8)
    return parser


def _service(args: argparse.Namespace) -> Service:
    return Service(
        bootstrap_servers=args.bootstrap_servers,
        queue_topic=args.queue_topic,
        marker_topic=args.marker_topic,
        redelivery_timeout_s=args.redelivery_timeout_s,
        session_timeout_ms=args.session_timeout_ms,
        create_topics=False,
        client_id=f"chaos-{args.name}",
    )


def _crash(what: str) -> None:
    """Report an unexpected failure and end the process at once, so the suite sees it."""
    sys.stdout.write(f"CRASH in {what}:\n{traceback.format_exc()}")
    sys.stdout.flush()
    os._exit(CRASH_EXIT_CODE)


def run_worker(args: argparse.Namespace) -> None:
    service = _service(args)
    ledger = Ledger(args.ledger)
    queues = args.queues.split(",")
    consumers = [service.queue(q).consumer(max_in_flight=args.max_in_flight) for q in queues]
    max_work_s = args.max_work_ms / 1000

    def consume(consumer: Consumer, rng: random.Random) -> None:
        try:
            while True:
                message = consumer.receive(timeout_s=1.0)
                if message is None:
                    continue
                where = {
                    "id": message.id,
                    "q": message.queue,
                    "a": message.attempt,
                    "l": message.lane,
                    "p": message.partition,
                    "o": message.offset,
                }
                ledger.write("took", **where)
                time.sleep(rng.uniform(0, max_work_s))  # the "work"
                if rng.random() < args.nack_probability:
                    try:
                        message.nack(0.0, reason=NACK_REASON)
                    except BrokerError as exc:
                        ledger.write("nack_failed", err=str(exc), **where)
                    else:
                        ledger.write("nacked", **where)
                else:
                    try:
                        message.ack()
                    except BrokerError as exc:
                        ledger.write("ack_failed", err=str(exc), **where)
                    else:
                        ledger.write("acked", **where)
        except BaseException:
            _crash(f"consumer of queue {consumer.queue!r}")

    # receive() is thread-safe: several handlers per consumer are a worker pool.
    threads = [
        threading.Thread(
            target=consume,
            args=(consumer, random.Random(f"{args.seed}/{args.name}/{consumer.queue}/{i}")),
            name=f"chaos-{consumer.queue}-{i}",
            daemon=True,
        )
        for consumer in consumers
        for i in range(args.handlers)
    ]
    for thread in threads:
        thread.start()
    print(f"chaos-worker {args.name} ready", flush=True)
    # consume() never returns; the suite SIGKILLs this process. Meanwhile: what each
    # consumer reads, whenever it changes (the ledger tells a live reader of a queue's retry
    # lane, an idle member's spare included, from none).
    reading: dict[str, tuple[list[int], list[int]]] = {}
    while True:
        for consumer in consumers:
            now = (sorted(consumer.assignment()), sorted(consumer.retry_assignment()))
            if reading.get(consumer.queue) != now:
                reading[consumer.queue] = now
                ledger.write("reads", q=consumer.queue, queue=now[0], retry=now[1])
        time.sleep(0.2)


def run_producer(args: argparse.Namespace) -> None:
    service = _service(args)
    ledger = Ledger(args.ledger)
    queues = args.queues.split(",")
    producers = {q: service.queue(q).producer() for q in queues}
    lock = threading.Lock()
    counter = iter(range(args.count))
    gave_up = 0
    started = time.monotonic()

    def send_loop() -> None:
        nonlocal gave_up
        try:
            while True:
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                pause = started + n / args.rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing: message n is due at n / rate
                queue = queues[n % len(queues)]
                payload = f"{args.name}:{n}".encode()
                for _ in range(SEND_TRIES):
                    try:
                        message_id = producers[queue].send(payload)
                    except BrokerError as exc:
                        ledger.write("send_failed", q=queue, n=n, err=str(exc))
                    else:
                        ledger.write("sent", id=message_id, q=queue, n=n)
                        break
                else:
                    ledger.write("gave_up", q=queue, n=n)
                    with lock:
                        gave_up += 1
        except BaseException:
            _crash("producer")

    print(f"chaos-producer {args.name} ready", flush=True)
    threads = [
        threading.Thread(target=send_loop, name=f"chaos-send-{i}", daemon=True)
        for i in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    service.close()
    print(f"chaos-producer {args.name} done: count={args.count} gave_up={gave_up}", flush=True)


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    # kafka-python's own warnings too (it logs nothing by default), for the post-mortem.
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.role == "worker":
        # Each group join, sync and rebalance of its consumers, with times: where a queue
        # with no reader spent its seconds (see README, Under chaos).
        logging.getLogger("kafka.coordinator").setLevel(logging.INFO)
        run_worker(args)
    else:
        run_producer(args)
