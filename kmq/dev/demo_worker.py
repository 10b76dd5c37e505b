"""A worker process for ``kmq demo``: consumes one queue and reports each step as JSON lines."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from kmq.consumer import Consumer
from kmq.message import Message
from kmq.service import Service


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def report_assignments(consumer: Consumer, name: str) -> None:
    """Emit the queue and retry-lane partitions this worker reads, each time they change
    (on a daemon thread, until the process exits)."""
    last: tuple[list[int], list[int]] | None = None
    while True:
        time.sleep(0.05)
        now = (sorted(consumer.assignment()), sorted(consumer.retry_assignment()))
        if now != last:
            last = now
            emit(event="assignment", worker=name, queue=now[0], retry=now[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--queue-topic", required=True)
    parser.add_argument("--marker-topic", required=True)
    parser.add_argument("--control-topic", default="kmq.control")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--redelivery-timeout-s", type=float, default=2.0)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--work-s", type=float, default=0.05)
    parser.add_argument("--max-in-flight", type=int, default=1)
    parser.add_argument(
        "--hang-after",
        type=int,
        default=-1,
        help="Ack this many messages, then hold every later one without settling it.",
    )
    args = parser.parse_args(argv)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    service = Service(
        bootstrap_servers=args.bootstrap_servers,
        queue_topic=args.queue_topic,
        marker_topic=args.marker_topic,
        control_topic=args.control_topic,
        redelivery_timeout_s=args.redelivery_timeout_s,
        session_timeout_ms=args.session_timeout_ms,
        create_topics=False,
    )
    acked = 0
    held: list[Message] = []
    queue = service.queue(args.queue)
    with service, queue.consumer(max_in_flight=args.max_in_flight) as consumer:
        threading.Thread(
            target=report_assignments, args=(consumer, args.name), daemon=True
        ).start()
        emit(event="ready", worker=args.name)
        for message in consumer:
            emit(event="took", worker=args.name, id=message.id, attempt=message.attempt)
            if 0 <= args.hang_after <= acked:
                held.append(message)  # never settled: only a kill ends this
                emit(event="holding", worker=args.name, id=message.id, attempt=message.attempt)
                continue
            time.sleep(args.work_s)
            message.ack()
            acked += 1
            emit(event="acked", worker=args.name, id=message.id, attempt=message.attempt)


if __name__ == "__main__":
    main()
