"""``python -m bench.requests [--count N] [--reps R]``: where the broker's CPU goes. Section 1's
single-queue run, raw and kmq, with every client connection through a proxy that counts
the Kafka requests by client and API (and, for produce requests, by the topic they write:
the queue topic or the markers); then what one request of each kind costs the embedded
broker in CPU, timed alone.

Not part of ``make bench``: it explains the broker's column of section 1 (a kmq message
costs the broker about four times a raw one), it does not measure kmq against a target.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench.common import Context, cpu_s
from bench.pipeline import Run, run_pipeline

_API = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
        9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
        14: "SyncGroup", 18: "ApiVersions", 19: "CreateTopics", 22: "InitProducerId",
        24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn",
        28: "TxnOffsetCommit"}  # fmt: skip


class CountingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port``, counting the requests that
    go through it by (client id without its trailing digits, API)."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self.counts)

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            requests = (client, upstream, self._framer())
            threading.Thread(target=_pump, args=requests, daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()

    def _framer(self) -> Callable[[bytes], None]:
        """A counter of the requests in one connection's client-to-broker bytes."""
        buf = bytearray()

        def seen(data: bytes) -> None:
            buf.extend(data)
            while len(buf) >= 4:
                (size,) = struct.unpack_from(">i", buf)
                if len(buf) < 4 + size:
                    break
                self._count(bytes(buf[4 : 4 + size]))
                del buf[: 4 + size]

        return seen

    def _count(self, frame: bytes) -> None:
        api, _version, _correlation, id_size = struct.unpack(">hhih", frame[:10])
        client = frame[10 : 10 + id_size].decode(errors="replace") if id_size > 0 else ""
        client = client.rstrip("0123456789-")
        if api == 0:  # which topic, roughly: enough to tell the queue from the markers
            head = frame[:300]
            client += ":markers" if b"markers" in head else ":queue" if b"queue" in head else ""
        with self._lock:
            self.counts[(client, _API.get(api, str(api)))] += 1


def _pump(
    src: socket.socket, dst: socket.socket, seen: Callable[[bytes], None] | None = None
) -> None:
    """Forward ``src`` to ``dst`` until either end closes, showing ``seen`` every chunk."""
    try:
        while data := src.recv(262_144):
            dst.sendall(data)
            if seen is not None:
                seen(data)
    except OSError:
        pass
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def per_request_costs(
    bootstrap: str, broker_pid: int, proxy: CountingProxy
) -> list[tuple[str, float]]:
    """The broker's CPU per request, in µs, for requests sent one at a time."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.structs import OffsetAndMetadata

    topic = "bench-requests"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-requests")
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    out: list[tuple[str, float]] = []
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="bench-requests",
                             acks="all", enable_idempotence=True, linger_ms=0)  # fmt: skip
    for _ in range(50):
        producer.send(topic, b"w" * 100, partition=0).get()
    for size, count in ((100, 2000), (5_000, 2000), (50_000, 500)):
        cpu0 = cpu_s(broker_pid)
        for i in range(count):
            producer.send(topic, b"x" * size, partition=i % 4).get()
        spent_us = (cpu_s(broker_pid) - cpu0) * 1e6
        out.append((f"produce of one {size:,} B record (acks=all, idempotent)", spent_us / count))
    producer.close()
    committer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="bench-requests",
                              group_id=topic, enable_auto_commit=False)  # fmt: skip
    tp = TopicPartition(topic, 0)
    committer.assign([tp])
    cpu0 = cpu_s(broker_pid)
    for i in range(2000):
        committer.commit({tp: OffsetAndMetadata(i, "", -1)})
    out.append(("offset commit", (cpu_s(broker_pid) - cpu0) * 1e6 / 2000))
    committer.close()
    for wait_ms in (0, 5, 50, 500):
        reader = KafkaConsumer(bootstrap_servers=bootstrap, client_id="bench-requests",
                               fetch_max_wait_ms=wait_ms, enable_auto_commit=False)  # fmt: skip
        tps = [TopicPartition(topic, p) for p in range(4)]
        reader.assign(tps)
        reader.seek_to_end()
        reader.poll(timeout_ms=200)
        before = proxy.snapshot()[("bench-requests", "Fetch")]
        cpu0 = cpu_s(broker_pid)
        until = time.monotonic() + 4.0
        while time.monotonic() < until:
            reader.poll(timeout_ms=100)
        spent_us = (cpu_s(broker_pid) - cpu0) * 1e6
        fetches = proxy.snapshot()[("bench-requests", "Fetch")] - before
        out.append((f"fetch with nothing to return, fetch_max_wait_ms={wait_ms} "
                    f"({fetches} in 4 s)", spent_us / max(1, fetches)))  # fmt: skip
        reader.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.requests")
    parser.add_argument("--count", type=int, default=80_000)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args(argv)
    from kmq.dev.embedded import EmbeddedBroker, free_port

    work_dir = Path(tempfile.mkdtemp(prefix="kmq-bench-requests-"))
    broker_port = free_port()
    proxy = CountingProxy(broker_port)
    with EmbeddedBroker(port=broker_port, log_path=work_dir / "tansu.log",
                        advertised_port=proxy.port) as broker:  # fmt: skip
        assert broker.process is not None
        bootstrap = f"127.0.0.1:{proxy.port}"
        ctx = Context(
            bootstrap_servers=bootstrap,
            session_timeout_ms=2000,
            quick=False,
            broker="embedded Tansu 0.6 (in memory), through a counting proxy",
            work_dir=work_dir,
            broker_pid=broker.process.pid,
        )
        per_1k: dict[str, Counter[tuple[str, str]]] = {"raw": Counter(), "kmq": Counter()}
        cpu: dict[str, list[str]] = {"raw": [], "kmq": []}
        for rep in range(args.reps):
            for side in ("raw", "kmq") if rep % 2 == 0 else ("kmq", "raw"):
                before = proxy.snapshot()
                result = run_pipeline(ctx, Run(side=side, queues=1, count=args.count))
                after = proxy.snapshot()
                for key, n in (after - before).items():
                    per_1k[side][key] += n
                cpu[side].append(
                    f"{result['acked_per_s']:,.0f} msgs/s, broker "
                    f"{result['cpu_us_per_msg']['broker']:.1f} µs/msg"
                )
        print(f"## Requests per 1,000 messages (1 queue, {args.count:,} messages, "
              f"{args.reps} runs a side)\n")  # fmt: skip
        for side in ("raw", "kmq"):
            print(f"{side}: {'; '.join(cpu[side])}\n")
            print("| client | API | requests per 1,000 messages |\n|---|---|---|")
            total = 0.0
            for (client, api), n in per_1k[side].most_common():
                rate = n / (args.count * args.reps) * 1000
                total += rate
                if rate >= 0.05:
                    print(f"| {client or '-'} | {api} | {rate:.2f} |")
            print(f"| all | all | {total:.2f} |\n")
        print("## Broker CPU per request, one at a time\n")
        print("| request | broker CPU µs |\n|---|---|")
        for what, us in per_request_costs(bootstrap, broker.process.pid, proxy):
            print(f"| {what} | {us:,.0f} |")


if __name__ == "__main__":
    main()
