"""The tracker's re-read on a long partition of small batches, under CPU load: the re-read
consumer's old settings ("old") against the tracker's ("new"), on one embedded broker, reads
alternated.

    .venv/bin/python -m bench.reread_far [--batches 120000] [--reads 10] [--busy 6]

One partition holds ``--batches`` one-record batches (100-byte values, sent one at a time:
what a slow producer leaves). ``--busy`` processes spin beside the broker, as a loaded
machine's other processes would. Each read asks :class:`tracker.reread.RecordReader` for 5
records among the last 300, first with the old settings (``fetch_max_wait_ms`` 50,
kafka-python's fetch sizes), then with the tracker's (500 ms, 256 KB: tried in 23354db,
reverted in 11a5e2c, restored since). Printed: each side's read time p50 / max, the
records left for the next round (the scan's 5 s budget spent), and the broker's CPU per read
(from /proc, so Linux only). Filling the partition took about a minute here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from kmq import kafka_clients
from kmq.dev.embedded import EmbeddedBroker
from kmq.records import delivery_key
from tracker.reread import FETCH_MAX_BYTES, FETCH_WAIT_MS, RecordReader
from tracker.state import Due

_TOPIC = "reread-far"
_SETTINGS: dict[str, dict[str, Any]] = {
    "old": {"fetch_max_wait_ms": 50},  # the tracker's from 11a5e2c until restored
    "new": {  # the tracker's: see the README's Performance section
        "fetch_max_wait_ms": FETCH_WAIT_MS,
        "fetch_max_bytes": FETCH_MAX_BYTES,
        "max_partition_fetch_bytes": FETCH_MAX_BYTES,
    },
}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fill(bootstrap_servers: str, batches: int) -> None:
    KafkaAdminClient(bootstrap_servers=bootstrap_servers).create_topics(
        [NewTopic(_TOPIC, 1, 1)]
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=0, batch_size=300)
    for _ in range(batches):
        producer.send(_TOPIC, b"x" * 100, partition=0)
    producer.flush()
    producer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=120_000)
    parser.add_argument("--reads", type=int, default=10)
    parser.add_argument("--busy", type=int, default=6)
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        assert broker.process is not None
        _fill(broker.bootstrap_servers, args.batches)
        conn = kafka_clients.KafkaConnection(broker.bootstrap_servers)
        readers = {
            name: RecordReader(
                kafka_clients.consumer(
                    conn,
                    "reader",
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    isolation_level="read_committed",
                    **settings,
                ),
                {0: _TOPIC},
            )
            for name, settings in _SETTINGS.items()
        }
        busy = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)
        ]
        rng = random.Random(1)
        times: dict[str, list[float]] = {name: [] for name in readers}
        waiting = dict.fromkeys(readers, 0)
        broker_cpu = dict.fromkeys(readers, 0.0)
        try:
            for _ in range(args.reads):
                for name, reader in readers.items():
                    due = [
                        Due(0, delivery_key(0, 0, args.batches - 1 - rng.randrange(300)),
                            0, 1, "bench", 0, "")
                        for _ in range(5)
                    ]  # fmt: skip
                    cpu0, began = _cpu_s(broker.process.pid), time.monotonic()
                    result = reader.read(due)
                    times[name].append(time.monotonic() - began)
                    broker_cpu[name] += _cpu_s(broker.process.pid) - cpu0
                    waiting[name] += len(result.waiting)
        finally:
            for process in busy:
                process.kill()
                process.wait()
    summary = {
        name: {
            "p50_ms": round(sorted(t)[len(t) // 2] * 1000),
            "max_ms": round(max(t) * 1000),
            "left_for_next_round": waiting[name],
            "broker_cpu_ms_per_read": round(broker_cpu[name] / len(t) * 1000),
        }
        for name, t in times.items()
    }
    print(json.dumps(summary))
    for name, s in summary.items():
        print(
            f"| {name} | {s['p50_ms']:,} ms | {s['max_ms']:,} ms | "
            f"{s['left_for_next_round']} | {s['broker_cpu_ms_per_read']:,} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
