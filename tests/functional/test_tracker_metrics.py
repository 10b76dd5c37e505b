"""The tracker's /metrics, /healthz and /readyz over HTTP against a known workload, and
what an operator sees when Kafka cannot be reached."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import kmq
from kmq.dev.embedded import EmbeddedBroker, free_port
from kmq.topics import ensure_topics
from tests.chaos.proxy import FaultProxy
from tests.functional.conftest import RunningTracker
from tests.functional.helpers import Children, get, scrape, total, wait_until
from tracker.config import TrackerConfig
from tracker.daemon import Tracker


def receive_n(consumer: kmq.Consumer, n: int, timeout_s: float = 20) -> list[kmq.Message]:
    got: list[kmq.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got.extend(consumer.receive_many(n - len(got), timeout_s=0.5))
    assert len(got) == n, f"received {len(got)} of {n}"
    return got


@pytest.fixture
def metered(tracker_config: TrackerConfig) -> Iterator[tuple[Tracker, int]]:
    port = free_port()
    running = RunningTracker(replace(tracker_config, metrics_port=port))
    try:
        assert running.tracker.wait_caught_up(30), "tracker never caught up"
        yield running.tracker, port
    finally:
        running.stop()


def test_metrics_and_probes_show_a_known_workload(
    metered: tuple[Tracker, int], service: kmq.Service
) -> None:
    tracker, port = metered
    wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "/readyz to say ready")
    status, body = get(port, "/readyz")
    assert json.loads(body) == {"ready": True, "problems": [], "partitions": [0, 1]}
    status, body = get(port, "/healthz")
    assert status == 200 and json.loads(body)["alive"] is True

    q = service.queue("metered")
    producer = q.producer()
    sent = {producer.send(f"m{i}".encode()) for i in range(7)}
    # Every message handed off, and the consumer closed with nothing held: from here on
    # receipts settle them, so no copy is started or released behind the test's back.
    with q.consumer(max_in_flight=10) as consumer:
        held = receive_n(consumer, 7)
        assert {m.id for m in held} == sent
        settle = consumer.hand_off_many(held[:5], lease_s=60.0)
        expire = consumer.hand_off_many(held[5:], lease_s=1.0)  # nobody settles these
    wait_until(lambda: total(scrape(port), "kmq_tracker_in_flight_messages") == 7, 15,
               "7 in flight")  # fmt: skip
    m = scrape(port)
    assert total(m, "kmq_tracker_markers_read_total", type="start") == 7
    assert total(m, "kmq_tracker_markers_read_total", type="end") == 0
    assert max(m["kmq_tracker_oldest_in_flight_age_seconds"].values()) > 0
    settler = kmq.Settler(service)
    try:
        settler.ack(settle[:3])
        settler.nack(settle[3], delay_s=0.1)
        settler.reject(settle[4], reason="poison")
    finally:
        settler.close()

    def settled() -> bool:
        m = scrape(port)
        return (
            total(m, "kmq_tracker_redeliveries_total") == 3
            and total(m, "kmq_tracker_dead_letters_total") == 1
            and total(m, "kmq_tracker_in_flight_messages") == 0
        )

    wait_until(settled, 30, "3 redeliveries, 1 dead letter and nothing in flight")
    m = scrape(port)
    reads = {kind: total(m, "kmq_tracker_markers_read_total", type=kind)
             for kind in ("start", "end", "nack", "reject", "release")}  # fmt: skip
    assert reads == {"start": 7, "end": 3, "nack": 1, "reject": 1, "release": 0}
    assert total(m, "kmq_tracker_markers_read_total", type="keepalive") >= 7  # the hand-offs
    assert total(m, "kmq_tracker_redeliveries_total", reason="nacked") == 1
    assert total(m, "kmq_tracker_redeliveries_total", reason="lease_expired") == 2
    assert total(m, "kmq_tracker_dead_letters_total", reason="rejected") == 1
    assert total(m, "kmq_tracker_bad_markers_total") == 0
    assert total(m, "kmq_tracker_oldest_in_flight_age_seconds") == 0
    assert total(m, "kmq_tracker_replaying") == 0
    assert {dict(k)["partition"] for k in m["kmq_tracker_replaying"]} == {"0", "1"}
    for name in ("kmq_tracker_ready", "kmq_tracker_broker_up", "kmq_tracker_group_stable"):
        assert total(m, name) == 1, name
    assert total(m, "kmq_tracker_partitions_assigned") == 2
    assert total(m, "kmq_tracker_last_turn_age_seconds") < 5
    assert {r.message_id for r in expire} == {h.id for h in held[5:]}
    # The same counters as the stats: log line, not a second count.
    stats = tracker.stats()
    assert (stats["redeliveries"], stats["dead_letters"], stats["start"]) == (3, 1, 7)
    wait_until(lambda: total(scrape(port), "kmq_tracker_marker_lag_records") == 0, 10,
               "the tracker to read to the end of its markers")  # fmt: skip


def test_unreachable_kafka_is_one_clear_json_line_and_not_ready(children: Children) -> None:
    port = free_port()
    tracker = children.python(
        "tracker", "-m", "tracker",
        "--bootstrap-servers", "127.0.0.1:1",
        "--request-timeout-ms", "1000",
        "--metrics-port", str(port),
        "--log-format", "json",
    )  # fmt: skip
    tracker.wait_for("127.0.0.1:1", 15)

    def failed_attempts() -> float:
        return total(scrape(port), "kmq_tracker_events_total", event="connect_failed")

    wait_until(lambda: failed_attempts() >= 2, 20, "a second attempt to reach Kafka")
    assert tracker.proc.poll() is None, "it gave up"
    status, body = get(port, "/readyz")
    assert status == 503
    assert "127.0.0.1:1 is unreachable" in json.loads(body)["problems"][0]
    assert get(port, "/healthz")[0] == 200
    assert total(scrape(port), "kmq_tracker_broker_up") == 0
    os.kill(tracker.pid, signal.SIGTERM)
    assert tracker.proc.wait(timeout=15) == 0
    tracker._drain(1.0)  # what it printed last, up to its exit
    lines = [json.loads(line) for line in tracker.lines if line.strip()]  # all JSON
    about = [rec for rec in lines if "127.0.0.1:1" in rec["message"]]
    assert len(about) == 1, about
    assert about[0]["level"] == "error"
    assert "is unreachable (Connection refused)" in about[0]["message"]
    assert not any("Traceback" in line for line in tracker.lines)


def test_kafka_lost_mid_run_is_one_line_each_way_and_readiness_follows(
    tmp_path: Path, children: Children
) -> None:
    """A tracker behind a proxy that stops forwarding: one line when Kafka is lost, /readyz
    503 meanwhile, one line when it is back, /readyz 200 again; no traceback."""
    proxy = FaultProxy()
    with EmbeddedBroker(log_path=tmp_path / "tansu.log", advertised_port=proxy.port) as broker:
        proxy.start(broker.port)
        try:
            tag = uuid.uuid4().hex[:8]
            svc = kmq.ServiceConfig(
                bootstrap_servers=proxy.address, queue_topic=f"l{tag}.queue",
                marker_topic=f"l{tag}.markers", control_topic=f"l{tag}.control",
                queue_partitions=2, marker_partitions=2,
            )  # fmt: skip
            ensure_topics(svc)
            port = free_port()
            tracker = children.python(
                "tracker", "-m", "tracker",
                "--bootstrap-servers", proxy.address,
                "--queue-topic", svc.queue_topic,
                "--marker-topic", svc.marker_topic,
                "--control-topic", svc.control_topic,
                "--group-id", f"tracker-{tag}",
                "--session-timeout-ms", "2000",
                "--request-timeout-ms", "3000",
                "--metrics-port", str(port),
            )  # fmt: skip
            wait_until(lambda: get(port, "/readyz")[0] == 200, 45, "ready (caught up)")

            upstream = proxy.upstream_port
            assert upstream is not None
            proxy.upstream_port = free_port()  # nothing listens there: connections fail
            proxy.reset(random.Random(0))
            wait_until(lambda: get(port, "/readyz")[0] == 503, 20, "not ready once Kafka is gone")
            tracker.wait_for(f"lost Kafka at {proxy.address}", 10)
            assert "Kafka unreachable" in json.loads(get(port, "/readyz")[1])["problems"][0]
            assert get(port, "/healthz")[0] == 200, "a tracker waiting for Kafka is alive"

            proxy.upstream_port = upstream
            wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "ready again")
            tracker.wait_for(f"Kafka at {proxy.address} is back", 10)
            os.kill(tracker.pid, signal.SIGTERM)
            assert tracker.proc.wait(timeout=30) == 0
            tracker.wait_for("stopped", 5)
            assert len([line for line in tracker.lines if "lost Kafka" in line]) == 1
            assert not any("Traceback" in line for line in tracker.lines)
            assert not any(" ERROR kafka" in line or " WARNING kafka" in line
                           for line in tracker.lines)  # fmt: skip
        finally:
            proxy.close()
