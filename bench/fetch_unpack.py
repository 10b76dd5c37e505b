"""Consumer CPU per record fetched: kafka-python's own record unpacking against kmq's
(:mod:`kmq.unpack`), on the same records of the same embedded broker, runs alternated.

    .venv/bin/python -m bench.fetch_unpack [--records 200000] [--rounds 4]

One topic of 4 partitions holds the records (100-byte value, a queue key, one ``kmq.id``
header: what a kmq queue record carries). Each run is a fresh kafka-python consumer that
assigns the partitions, reads every record from the start and reports this process's CPU
time (user + system, every thread) per record. Both consumers return the same
ConsumerRecords (tests/unit/test_unpack.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from kmq import unpack
from kmq.dev.embedded import EmbeddedBroker

_TOPIC = "fetch-unpack"
_PARTITIONS = 4


def _fill(bootstrap_servers: str, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=5, batch_size=64 * 1024)
    for i in range(count):
        producer.send(
            _TOPIC,
            key=b"work",
            value=b"x" * 100,
            headers=[("kmq.id", b"%032x" % i)],
            partition=i % _PARTITIONS,
        )
    producer.flush()
    producer.close()


def _read_all(bootstrap_servers: str, count: int, kmq_unpack: bool) -> float:
    """CPU µs per record of reading ``count`` records from the start."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        max_partition_fetch_bytes=1 << 20,
    )
    if kmq_unpack and not unpack.install(consumer):
        raise RuntimeError("kafka-python's fetcher has no PartitionRecords hook")
    try:
        consumer.assign([TopicPartition(_TOPIC, p) for p in range(_PARTITIONS)])
        consumer.seek_to_beginning()
        read = 0
        cpu0 = time.process_time()
        while read < count:
            for records in consumer.poll(timeout_ms=1000, max_records=500).values():
                read += len(records)
        return (time.process_time() - cpu0) / count * 1e6
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    found: dict[str, list[float]] = {"kafka-python": [], "kmq.unpack": []}
    with EmbeddedBroker() as broker:
        _fill(broker.bootstrap_servers, args.records)
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for kmq_unpack in order:
                name = "kmq.unpack" if kmq_unpack else "kafka-python"
                cpu = _read_all(broker.bootstrap_servers, args.records, kmq_unpack)
                found[name].append(round(cpu, 2))
    medians = {name: statistics.median(v) for name, v in found.items()}
    print(json.dumps({"cpu_us_per_record": found, "median": medians}))
    print(
        f"| {args.records:,} records | {medians['kafka-python']:.2f} µs | "
        f"{medians['kmq.unpack']:.2f} µs | "
        f"{medians['kmq.unpack'] / medians['kafka-python']:.2f}x |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
