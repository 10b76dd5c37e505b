"""Child processes of the benchmark: ``python -m bench.worker ROLE '<json args>'``.

Every role prints JSON lines on stdout: ``{"event": "ready"}`` once it is set up, then
``{"event": "result", ...}``, or ``{"event": "error", ...}``. Each measured role runs in its own
process so that producer, consumers and tracker never share a GIL, and so py-spy can attach
to exactly one of them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench.common import JSON, make_payload, read_payload

# -- plumbing ---------------------------------------------------------------------------

_out_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.02)


# -- producers --------------------------------------------------------------------------

RAW_PRODUCER_SETTINGS: JSON = {
    # The same settings as kmq's shared producer (kmq/service.py), so only kmq differs.
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 0,
    "batch_size": 65_536,
    "max_request_size": 1_000_000,
    "metrics_enabled": False,  # kmq's clients keep kafka-python's own metrics off too
    "request_timeout_ms": 30_000,
}


def _raw_producer(bootstrap_servers: str, topics: list[str]) -> Any:
    from kafka import KafkaProducer

    kp = KafkaProducer(
        bootstrap_servers=bootstrap_servers,
        client_id="bench-raw-producer",
        **RAW_PRODUCER_SETTINGS,
    )
    for topic in topics:
        _wait_for(partial(_has_partitions, kp, topic), 30, f"partitions of {topic}")
    return kp


def _has_partitions(kp: Any, topic: str) -> bool:
    return bool(kp.partitions_for(topic))


def _kmq_service(a: JSON, **overrides: Any) -> Any:
    from kmq import Service

    settings: JSON = {
        "bootstrap_servers": a["bootstrap_servers"],
        "queue_topic": a["queue_topic"],
        "marker_topic": a["marker_topic"],
        "session_timeout_ms": a["session_timeout_ms"],
        "redelivery_timeout_s": a.get("lease_s", 30.0),
        "create_topics": False,
    }
    if a.get("control_topic"):
        settings["control_topic"] = a["control_topic"]
    settings.update(overrides)
    return Service(**settings)


def role_produce(a: JSON) -> None:
    """Send ``count`` stamped payloads round-robin over topics (raw) or queues (kmq),
    unpaced or at ``rate`` messages per second, then flush."""
    count: int = a["count"]
    size: int = a.get("size", 100)
    rate: float = a.get("rate", 0.0)
    send: Callable[[int, bytes], None]
    if a["side"] == "raw":
        topics: list[str] = a["topics"]
        partitions: int = a["partitions"]
        kp = _raw_producer(a["bootstrap_servers"], topics)
        n = len(topics)

        def send(i: int, payload: bytes) -> None:
            kp.send(topics[i % n], key=b"q", value=payload, partition=(i // n) % partitions)

        def flush() -> None:
            kp.flush()

        def close() -> None:
            kp.close(timeout=10)

    else:
        svc = _kmq_service(a)
        producers = [svc.queue(q).producer() for q in a["queues"]]
        svc.kafka_producer()
        svc.queue_partition_count()
        n = len(producers)

        def send(i: int, payload: bytes) -> None:
            producers[i % n].send(payload, wait=False)

        def flush() -> None:
            producers[0].flush()

        def close() -> None:
            svc.close(timeout_s=10)

    emit("ready")
    time.sleep(a.get("start_delay_s", 0.0))  # a profiler attaching meanwhile
    cpu0 = time.process_time()
    first = time.monotonic()
    for i in range(count):
        if rate > 0:
            delay = first + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        send(i, make_payload(i, size))
    last = time.monotonic()
    flush()
    flushed = time.monotonic()
    cpu_s = time.process_time() - cpu0
    close()
    emit(
        "result",
        count=count,
        first_send=first,
        last_send=last,
        flushed=flushed,
        cpu_s=cpu_s,
    )


# -- consumers --------------------------------------------------------------------------


@dataclass
class _Tally:
    """What one consuming thread saw; merged by the main thread at the end."""

    quota: int
    acked: set[int] = field(default_factory=set)
    duplicates: int = 0
    first_recv: float | None = None
    last_ack: float | None = None
    latency_ms: list[float] = field(default_factory=list)
    recv_at: dict[str, float] = field(default_factory=dict)
    dropped_at: dict[int, float] = field(default_factory=dict)
    nacked_at: dict[int, float] = field(default_factory=dict)
    redelivered_at: dict[int, float] = field(default_factory=dict)
    copy_parts_ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Per dropped message, by wall clock: (its copy's record timestamp - the drop - the
    lease, the copy's receive - that timestamp): the tracker's part and the consumer's."""
    redeliveries: int = 0
    spurious: int = 0
    first_attempt_last_ack: float | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return len(self.acked) >= self.quota


def _merge(tallies: list[_Tally], warmup: int) -> JSON:
    firsts = [t.first_recv for t in tallies if t.first_recv is not None]
    lasts = [t.last_ack for t in tallies if t.last_ack is not None]
    fa_lasts = [t.first_attempt_last_ack for t in tallies if t.first_attempt_last_ack is not None]
    latency: list[float] = []
    for t in tallies:
        latency.extend(t.latency_ms[warmup:])
    return {
        "acked": sum(len(t.acked) for t in tallies),
        "duplicates": sum(t.duplicates for t in tallies),
        "first_recv": min(firsts) if firsts else None,
        "last_ack": max(lasts) if lasts else None,
        "first_attempt_last_ack": max(fa_lasts) if fa_lasts else None,
        "latency_ms": latency,
        "redeliveries": sum(t.redeliveries for t in tallies),
        "spurious_redeliveries": sum(t.spurious for t in tallies),
        "errors": [t.error for t in tallies if t.error],
    }


def role_consume_raw(a: JSON) -> None:
    """One KafkaConsumer (own group, own thread) per topic: poll, read, commit each batch."""
    from kafka import KafkaConsumer

    topics: list[str] = a["topics"]
    quota = a["count"] // len(topics)
    session_ms: int = a["session_timeout_ms"]
    deadline = time.monotonic() + a["timeout_s"]
    tallies = [_Tally(quota) for _ in topics]
    ready = [threading.Event() for _ in topics]

    def run(i: int) -> None:
        tally = tallies[i]
        try:
            kc = KafkaConsumer(
                topics[i],
                bootstrap_servers=a["bootstrap_servers"],
                client_id="bench-raw-consumer",
                group_id=f"{a['group_prefix']}.{topics[i]}",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=session_ms,
                heartbeat_interval_ms=max(100, session_ms // 4),
                request_timeout_ms=max(30_000, session_ms + 5000),
                fetch_max_wait_ms=100,
                metrics_enabled=False,  # as kmq's consumers
            )
            try:
                while not tally.done and time.monotonic() < deadline:
                    records = kc.poll(timeout_ms=100, max_records=a["max_records"])
                    if not ready[i].is_set() and kc.assignment():
                        ready[i].set()
                    if not records:
                        continue
                    now_ns = time.monotonic_ns()
                    if tally.first_recv is None:
                        tally.first_recv = now_ns / 1e9
                    for batch in records.values():
                        for record in batch:
                            seq, sent_ns = read_payload(record.value)
                            if seq in tally.acked:
                                tally.duplicates += 1
                                continue
                            tally.acked.add(seq)
                            tally.latency_ms.append((now_ns - sent_ns) / 1e6)
                    kc.commit()
                    tally.last_ack = time.monotonic()
            finally:
                kc.close(autocommit=False)
        except Exception as exc:
            tally.error = repr(exc)
            ready[i].set()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(topics))]
    for thread in threads:
        thread.start()
    _wait_for(lambda: all(e.is_set() for e in ready), 60, "raw consumers to join")
    emit("ready")
    cpu0 = time.process_time()
    for thread in threads:
        thread.join()
    merged = _merge(tallies, a.get("warmup", 0))
    merged["done"] = merged["last_ack"]
    merged["cpu_s"] = time.process_time() - cpu0
    _finish_consumer(a, merged)


def _abandon(consumer: Any, message: Any) -> None:
    """Lose a received message the way a crashed consumer would: it stays STARTed, but no
    END, NACK or KEEPALIVE is ever written for it, so its lease runs out at the tracker.

    A live kmq consumer keeps every held message alive, so dropping one without a crash
    needs kmq's private state; this is benchmark-only code.
    """
    from kmq.message import State

    with consumer._cond:
        consumer._leases.settle(message.key)
        message._state = State.RELEASED


def _delivery(message: Any) -> str:
    """How the consumer and the tracker probe name one delivery (markers carry no ids)."""
    return f"{message.lane}:{message.partition}:{message.offset}"


def role_consume_kmq(a: JSON) -> None:
    """One kmq consumer (and one application thread) per logical queue: receive, ack. With
    ``batch_ack``: receive_many(``batch_size``, default 100), then one durable ack_many() per
    batch."""
    queues: list[str] = a["queues"]
    quota = a["count"] // len(queues)
    deadline = time.monotonic() + a["timeout_s"]
    ack_wait: bool = a.get("ack_wait", False)
    batch_ack: bool = a.get("batch_ack", False)
    drop_pct: int = a.get("drop_pct", 0)
    lease_s: float = a.get("lease_s", 30.0)
    wall_minus_monotonic = time.time() - time.monotonic()  # record timestamps are wall clock
    nack_pct: int = a.get("nack_pct", 0)
    work_s: float = a.get("work_ms", 0.0) / 1000
    want_ids: bool = a.get("record_ids", False)
    batch_size: int = a.get("batch_size", 100)
    svc = _kmq_service(a)
    consumers = [
        svc.queue(q).consumer(
            max_in_flight=a["max_in_flight"],
            poll_timeout_ms=100,
            **a.get("consumer_options", {}),
        )
        for q in queues
    ]
    tallies = [_Tally(quota) for _ in queues]

    def run_batches(i: int) -> None:
        consumer, tally = consumers[i], tallies[i]
        try:
            while not tally.done and time.monotonic() < deadline:
                batch = consumer.receive_many(batch_size, timeout_s=0.2)
                if not batch:
                    continue
                now_ns = time.monotonic_ns()
                if tally.first_recv is None:
                    tally.first_recv = now_ns / 1e9
                for message in batch:
                    seq, sent_ns = read_payload(message.payload)
                    if seq in tally.acked:
                        tally.duplicates += 1
                    tally.acked.add(seq)
                    tally.latency_ms.append((now_ns - sent_ns) / 1e6)
                consumer.ack_many(batch)  # durable: every END is on the broker
                tally.last_ack = tally.first_attempt_last_ack = time.monotonic()
        except Exception as exc:
            tally.error = repr(exc)

    def run(i: int) -> None:
        consumer, tally = consumers[i], tallies[i]
        try:
            while not tally.done and time.monotonic() < deadline:
                message = consumer.receive(timeout_s=0.2)
                if message is None:
                    continue
                now_ns = time.monotonic_ns()
                now = now_ns / 1e9
                if tally.first_recv is None:
                    tally.first_recv = now
                seq, sent_ns = read_payload(message.payload)
                if message.attempt > 1:
                    tally.redeliveries += 1
                    if seq in tally.dropped_at or seq in tally.nacked_at:
                        tally.redelivered_at.setdefault(seq, now)
                        dropped = tally.dropped_at.get(seq)
                        if dropped is not None and seq not in tally.copy_parts_ms:
                            # The copy's timestamp (wall clock): when the tracker's producer
                            # sent it.
                            written = message.timestamp_ms / 1000 - wall_minus_monotonic
                            tally.copy_parts_ms[seq] = (
                                (written - dropped - lease_s) * 1000,
                                (now - written) * 1000,
                            )
                    else:
                        tally.spurious += 1
                elif drop_pct and seq % 100 < drop_pct:
                    tally.dropped_at[seq] = now
                    _abandon(consumer, message)
                    continue
                elif nack_pct and drop_pct <= seq % 100 < drop_pct + nack_pct:
                    tally.nacked_at[seq] = now
                    message.nack(0.0)
                    continue
                if work_s:
                    time.sleep(work_s)
                message.ack(wait=ack_wait)
                tally.last_ack = time.monotonic()
                if message.attempt == 1:
                    tally.first_attempt_last_ack = tally.last_ack
                    tally.latency_ms.append((now_ns - sent_ns) / 1e6)
                    if want_ids:
                        tally.recv_at[_delivery(message)] = now
                if seq in tally.acked:
                    tally.duplicates += 1
                tally.acked.add(seq)
        except Exception as exc:
            tally.error = repr(exc)

    _wait_for(lambda: all(c.assignment() for c in consumers), 60, "kmq consumers to join")
    emit("ready")
    cpu0 = time.process_time()
    target = run_batches if batch_ack else run
    threads = [
        threading.Thread(target=target, args=(i,), daemon=True) for i in range(len(queues))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for consumer in consumers:  # every END marker on the broker
        consumer.flush(timeout_s=30)
    flushed = time.monotonic()
    merged = _merge(tallies, a.get("warmup", 0))
    merged["done"] = flushed
    merged["cpu_s"] = time.process_time() - cpu0
    if drop_pct:
        delays: list[float] = []
        missing = 0
        for t in tallies:
            for seq, dropped in t.dropped_at.items():
                again = t.redelivered_at.get(seq)
                if again is None:
                    missing += 1
                else:
                    delays.append((again - dropped - lease_s) * 1000)
        merged["dropped"] = sum(len(t.dropped_at) for t in tallies)
        merged["redelivery_delay_beyond_lease_ms"] = delays
        merged["never_redelivered"] = missing
        parts = [p for t in tallies for p in t.copy_parts_ms.values()]
        merged["copy_written_beyond_lease_ms"] = [p[0] for p in parts]
        merged["copy_taken_after_written_ms"] = [p[1] for p in parts]
    if nack_pct:
        nack_delays = [
            (t.redelivered_at[seq] - at) * 1000
            for t in tallies
            for seq, at in t.nacked_at.items()
            if seq in t.redelivered_at
        ]
        merged["nacked"] = sum(len(t.nacked_at) for t in tallies)
        merged["nack_delay_ms"] = nack_delays
    if want_ids:
        recv_at: dict[str, float] = {}
        for t in tallies:
            recv_at.update(t.recv_at)
        with open(a["samples_path"], "w") as out:
            json.dump(recv_at, out)
    for consumer in consumers:
        consumer.close(timeout_s=10)
    svc.close(timeout_s=10)
    _finish_consumer(a, merged)


def _finish_consumer(a: JSON, merged: JSON) -> None:
    from bench.common import rss_kb, summarize

    latency = merged.pop("latency_ms")
    delays = merged.pop("redelivery_delay_beyond_lease_ms", None)
    nack_delays = merged.pop("nack_delay_ms", None)
    if nack_delays is not None:
        merged["nack_delay_ms"] = summarize(nack_delays)
    merged["latency_ms"] = summarize(latency) if a.get("latency") else None
    if delays is not None:
        merged["redelivery_delay_beyond_lease_ms"] = summarize(delays)
    for part in ("copy_written_beyond_lease_ms", "copy_taken_after_written_ms"):
        if part in merged:
            merged[part] = summarize(merged[part])
    merged["rss_kb"] = rss_kb(os.getpid())
    emit("result", **merged)


# -- an instrumented tracker ------------------------------------------------------------


def role_tracker_probe(a: JSON) -> None:
    """The real tracker (tracker.daemon.Tracker), plus a note of when each END marker
    reaches its state object: the moment an ack becomes visible to the tracker."""
    from kmq.markers import MarkerType, decode_all
    from tracker.config import TrackerConfig
    from tracker.daemon import Tracker
    from tracker.state import PartitionState

    seen: dict[str, float] = {}
    original = PartitionState.on_record

    def on_record(self: PartitionState, offset: int, value: bytes | None, now: float) -> None:
        original(self, offset, value, now)
        try:
            found = decode_all(value)
        except Exception:
            return
        for marker in found:
            if marker.type is MarkerType.END:
                seen.setdefault(f"{marker.lane}:{marker.partition}:{marker.offset}", now)

    PartitionState.on_record = on_record  # type: ignore[method-assign]
    tracker = Tracker(
        TrackerConfig(
            bootstrap_servers=a["bootstrap_servers"],
            queue_topic=a["queue_topic"],
            marker_topic=a["marker_topic"],
            control_topic=a["control_topic"],
            group_id=a["group_id"],
            default_redelivery_timeout_s=a.get("lease_s", 30.0),
            session_timeout_ms=a["session_timeout_ms"],
        )
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: tracker.stop())

    def announce() -> None:
        if tracker.wait_caught_up(60):
            emit("ready")

    threading.Thread(target=announce, daemon=True).start()
    tracker.run()
    with open(a["samples_path"], "w") as out:
        json.dump(seen, out)
    emit("result", ends_seen=len(seen), stats=dict(tracker.stats()))


# -- section 5: producer throughput -----------------------------------------------------


def role_producer_bench(a: JSON) -> None:
    """Raw KafkaProducer and kmq.Producer, alternately, per payload size and mode."""
    topic: str = a["raw_topic"]
    partitions: int = a["partitions"]
    kp = _raw_producer(a["bootstrap_servers"], [topic])
    svc = _kmq_service(a)
    producer = svc.queue("bench").producer()
    svc.kafka_producer()
    svc.queue_partition_count()
    rr = [0]

    def raw_send(payload: bytes, wait: bool) -> None:
        rr[0] += 1
        future = kp.send(topic, key=b"bench", value=payload, partition=rr[0] % partitions)
        if wait:
            future.get(timeout=30)

    def kmq_send(payload: bytes, wait: bool) -> None:
        producer.send(payload, wait=wait)

    sides: dict[str, tuple[Callable[[bytes, bool], None], Callable[[], None]]] = {
        "raw": (raw_send, kp.flush),
        "kmq": (kmq_send, producer.flush),
    }
    for side in sides.values():  # connections, metadata, first batches
        for _ in range(50):
            side[0](b"w" * 100, False)
        side[1]()
    emit("ready")
    cases: list[JSON] = []
    threads_n = a.get("sync_threads", 8)
    for size in a["sizes"]:
        payload = b"p" * size
        for mode in ("async", "sync", "sync_threads"):
            if mode == "async":
                count = max(1000, min(a["async_count"], a["async_bytes"] // size))
            elif mode == "sync":
                count = a["sync_count"]
            else:
                count = a["sync_count"] * 2 // threads_n * threads_n
            order = ("raw", "kmq") if len(cases) % 4 == 0 else ("kmq", "raw")
            for name in order:
                send, flush = sides[name]

                def loop(
                    n: int,
                    send: Callable[[bytes, bool], None] = send,
                    payload: bytes = payload,
                    wait: bool = mode != "async",
                ) -> None:
                    for _ in range(n):
                        send(payload, wait)

                start = time.perf_counter()
                if mode == "sync_threads":  # each thread waits; the sends share round trips
                    workers = [
                        threading.Thread(target=loop, args=(count // threads_n,))
                        for _ in range(threads_n)
                    ]
                    for w in workers:
                        w.start()
                    for w in workers:
                        w.join()
                else:
                    loop(count)
                flush()
                elapsed = time.perf_counter() - start
                cases.append(
                    {
                        "side": name,
                        "size": size,
                        "mode": mode,
                        "count": count,
                        "seconds": elapsed,
                        "msgs_per_s": count / elapsed,
                        "mb_per_s": count * size / elapsed / 1e6,
                    }
                )
    kp.close(timeout=10)
    svc.close(timeout_s=10)
    emit("result", cases=cases)


# -- section 4: the tracker's pure core -------------------------------------------------


def role_tracker_core(a: JSON) -> None:
    from bench.tracker_core import run_core

    emit("result", **run_core(a))


def role_tracker_rss(a: JSON) -> None:
    from bench.tracker_core import run_rss

    emit("result", **run_rss(a))


# -- section 8: the HTTP proxy (kmq serve) ----------------------------------------------


def _http_client(a: JSON) -> Any:
    """An httpx client of the proxy with the bench's bearer token (keep-alive)."""
    import httpx

    return httpx.Client(
        base_url=a["url"],
        headers={"Authorization": f"Bearer {a['token']}"},
        timeout=a.get("http_timeout_s", 60.0),
    )


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")


def role_batch_send(a: JSON) -> None:
    """Send ``count`` stamped payloads in durable batches of ``batch`` from ``threads``
    threads, unpaced or at ``rate`` messages/s. ``side`` "proxy": one ``POST
    /v1/queues/{q}/messages/batch`` per batch (its own keep-alive client per thread); "kmq":
    ``kmq.Producer.send(wait=False)`` per message, then ``flush()`` per batch. Either way a
    batch is on the broker before its thread sends the next."""
    count: int = a["count"]
    size: int = a.get("size", 100)
    batch: int = a["batch"]
    rate: float = a.get("rate", 0.0)
    n_threads: int = a["threads"]
    batches = -(-count // batch)
    send_batch: Callable[[int, list[bytes]], None]
    closers: list[Callable[[], None]] = []
    if a["side"] == "proxy":
        clients = [_http_client(a) for _ in range(n_threads)]
        path = f"/v1/queues/{a['queue']}/messages/batch"
        for client in clients:  # open every connection before the clock starts
            client.get("/v1/health").raise_for_status()
            closers.append(client.close)

        def send_batch(thread: int, payloads: list[bytes]) -> None:
            body = {"messages": [{"body": _b64(p)} for p in payloads]}
            r = clients[thread].post(path, json=body)
            if r.status_code != 201:
                raise RuntimeError(f"batch send: {r.status_code} {r.text[:300]}")

    else:
        svc = _kmq_service(a)
        producer = svc.queue(a["queue"]).producer()
        svc.kafka_producer()
        svc.queue_partition_count()
        closers.append(partial(svc.close, timeout_s=10))

        def send_batch(thread: int, payloads: list[bytes]) -> None:
            for payload in payloads:
                producer.send(payload, wait=False)
            producer.flush(timeout_s=30)

    lock = threading.Lock()
    next_batch = [0]
    first = 0.0  # set just before the threads start
    round_trips_ms: list[float] = []
    errors: list[str] = []

    def run(thread: int) -> None:
        try:
            while True:
                with lock:
                    k = next_batch[0]
                    next_batch[0] += 1
                if k >= batches:
                    return
                if rate > 0:
                    delay = first + k * batch / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                start = k * batch
                payloads = [make_payload(i, size) for i in range(start, min(count, start + batch))]
                t0 = time.perf_counter()
                send_batch(thread, payloads)
                elapsed_ms = (time.perf_counter() - t0) * 1000
                with lock:
                    round_trips_ms.append(elapsed_ms)
        except Exception as exc:
            with lock:
                errors.append(repr(exc))
                next_batch[0] = batches  # the others stop too

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n_threads)]
    emit("ready")
    cpu0 = time.process_time()
    first = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    last = time.monotonic()
    cpu_s = time.process_time() - cpu0
    for close in closers:
        close()
    if errors:
        raise RuntimeError(f"sender errors: {errors[:3]}")
    from bench.common import summarize

    emit(
        "result",
        count=count,
        first_send=first,
        last_send=last,
        flushed=last,
        cpu_s=cpu_s,
        batch_round_trip_ms=summarize(round_trips_ms),
    )


def role_proxy_receive(a: JSON) -> None:
    """``clients`` threads, each with its own keep-alive HTTP client of the proxy: ``POST
    .../receive`` (``max_messages``, long poll ``wait_s``), then one ``POST .../ack`` of the
    batch's receipts, until ``count`` distinct messages are acked.

    Before it says ready it sends one probe message through the proxy and receives and acks
    it: the proxy's consumer of the queue has then joined its group and fetches, and its
    producer knows the queue's partitions, so neither start-up is timed."""
    import base64

    from bench.common import rss_kb, summarize

    count: int = a["count"]
    queue: str = a["queue"]
    max_messages: int = a["max_messages"]
    wait_s: float = a.get("wait_s", 1.0)
    warmup: int = a.get("warmup", 0)
    base = f"/v1/queues/{queue}"
    clients = [_http_client(a) for _ in range(a["clients"])]

    probe = clients[0]
    r = probe.post(f"{base}/messages", json={"body": _b64(make_payload(-1, 16))})
    if r.status_code != 201:
        raise RuntimeError(f"probe send: {r.status_code} {r.text[:300]}")
    deadline = time.monotonic() + 90
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the probe message never came back through the proxy")
        r = probe.post(f"{base}/receive", json={"max_messages": 10, "wait_s": 1.0})
        r.raise_for_status()
        got = r.json()["messages"]
        if got:
            receipts = [m["receipt"] for m in got]
            probe.post(f"{base}/ack", json={"receipts": receipts}).raise_for_status()
            break
    for client in clients[1:]:
        client.get("/v1/health").raise_for_status()

    lock = threading.Lock()
    acked: set[int] = set()
    latency_ms: list[float] = []
    stats = {"receives": 0, "empty_receives": 0, "messages": 0, "duplicates": 0,
             "redeliveries": 0}  # fmt: skip
    marks: dict[str, float] = {}
    errors: list[str] = []
    stop_at = time.monotonic() + a["timeout_s"]

    def run(i: int) -> None:
        client = clients[i]
        try:
            while time.monotonic() < stop_at:
                with lock:
                    if len(acked) >= count:
                        return
                r = client.post(
                    f"{base}/receive", json={"max_messages": max_messages, "wait_s": wait_s}
                )
                if r.status_code != 200:
                    raise RuntimeError(f"receive: {r.status_code} {r.text[:300]}")
                got = r.json()["messages"]
                now_ns = time.monotonic_ns()
                if not got:
                    with lock:
                        stats["receives"] += 1
                        stats["empty_receives"] += 1
                    continue
                seen: list[tuple[int, int, int]] = []
                for m in got:
                    seq, sent_ns = read_payload(base64.b64decode(m["body"]))
                    seen.append((seq, sent_ns, m["attempt"]))
                r = client.post(f"{base}/ack", json={"receipts": [m["receipt"] for m in got]})
                if r.status_code != 200:
                    raise RuntimeError(f"ack: {r.status_code} {r.text[:300]}")
                acked_at = time.monotonic()
                with lock:
                    stats["receives"] += 1
                    stats["messages"] += len(got)
                    marks.setdefault("first_recv", now_ns / 1e9)
                    marks["last_ack"] = acked_at
                    for seq, sent_ns, attempt in seen:
                        if seq < 0:
                            continue
                        if attempt > 1:
                            stats["redeliveries"] += 1
                        else:
                            latency_ms.append((now_ns - sent_ns) / 1e6)
                        if seq in acked:
                            stats["duplicates"] += 1
                        acked.add(seq)
        except Exception as exc:
            with lock:
                errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(clients))]
    emit("ready")
    cpu0 = time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu_s = time.process_time() - cpu0
    for client in clients:
        client.close()
    receives = stats["receives"] - stats["empty_receives"]
    emit(
        "result",
        acked=len(acked),
        duplicates=stats["duplicates"],
        redeliveries=stats["redeliveries"],
        first_recv=marks.get("first_recv"),
        last_ack=marks.get("last_ack"),
        done=marks.get("last_ack"),
        receives=stats["receives"],
        empty_receives=stats["empty_receives"],
        messages_per_receive=stats["messages"] / receives if receives else None,
        latency_ms=summarize(latency_ms[warmup:]),
        cpu_s=cpu_s,
        rss_kb=rss_kb(os.getpid()),
        errors=errors,
    )


ROLES: dict[str, Callable[[JSON], None]] = {
    "produce": role_produce,
    "consume-raw": role_consume_raw,
    "consume-kmq": role_consume_kmq,
    "tracker-probe": role_tracker_probe,
    "producer-bench": role_producer_bench,
    "tracker-core": role_tracker_core,
    "tracker-rss": role_tracker_rss,
    "batch-send": role_batch_send,
    "proxy-receive": role_proxy_receive,
}


def main(argv: list[str]) -> int:
    role, args = argv[0], json.loads(argv[1])
    try:
        ROLES[role](args)
    except BaseException as exc:
        traceback.print_exc()
        emit("error", error=repr(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
