"""`kmq audit --follow` against a live workload: a killed worker's message is flagged stuck
while no tracker runs, and clears once the tracker's redelivered copy is acked; bad marker
records are counted, never a failed query."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from pyspark.sql import SparkSession

import kmq
from kmq._proto import marker_pb2
from kmq.audit.follow import FollowConfig, run_follow
from kmq.markers import Marker, MarkerType, encode
from tests.functional.conftest import Broker, RunningTracker, Topics, worker_argv
from tests.functional.helpers import Children
from tracker.config import TrackerConfig


def _summary(out: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((out / "summary.json").read_text())
        return data
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _until(out: Path, ok: Callable[[dict[str, Any]], bool], timeout_s: float, what: str,
           failure: list[BaseException]) -> dict[str, Any]:  # fmt: skip
    """Poll summary.json until ``ok`` holds; on time-out, show the last one. Fails at once
    when the follow job has stopped with an error."""
    deadline = time.monotonic() + timeout_s
    while True:
        summary = _summary(out)
        if summary and ok(summary):
            return summary
        if failure:
            raise AssertionError(f"the follow job failed while waiting for {what}") from failure[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}: {summary}")
        time.sleep(0.2)


def _stuck(summary: dict[str, Any]) -> dict[str, str]:
    return {s["message_id"]: s["why"] for s in summary.get("stuck", ())}


def _write_bad_markers(bootstrap: str, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    future_version = marker_pb2.Marker(version=9, type=1, queue="jobs", message_id="v9", attempt=1)  # type: ignore[arg-type]
    future_type = marker_pb2.Marker(version=1, type=42, queue="jobs", message_id="t42", attempt=1)  # type: ignore[arg-type]
    for key, value in (
        (b"junk", b"\xff\xfe not a marker"),
        (b"v9", future_version.SerializeToString()),
        (b"t42", future_type.SerializeToString()),
        # an END naming a record that is not on the queue topic (retention took it, say)
        (b"gone", encode(Marker(MarkerType.END, 1, 10**9, 1))),
    ):
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()


@pytest.mark.timeout(300)
def test_follow_flags_a_killed_workers_message_until_its_copy_is_acked(
    spark: SparkSession,
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
    tmp_path: Path,
) -> None:
    out = tmp_path / "follow"
    prom = tmp_path / "kmq.prom"
    config = FollowConfig(
        bootstrap_servers=broker.bootstrap_servers,
        output=out,
        queue_topic=topics.queue,
        marker_topic=topics.markers,
        trigger_s=1.0,
        stuck_leases=2.0,
        pending_bound_s=3.0,
        window_s=120.0,
        settled_horizon_s=5.0,
        orphan_after_s=5.0,
        prometheus=prom,
    )
    _write_bad_markers(broker.bootstrap_servers, topics.markers)
    stop = threading.Event()
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            run_follow(spark, config, say=lambda _: None, stop=stop)
        except BaseException as exc:  # surfaced by the test below
            failure.append(exc)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        jobs = service.queue("jobs").producer()
        sent = [jobs.send(b"job-%d" % i) for i in range(3)]
        idle = service.queue("idle").producer().send(b"nobody takes this")
        worker = children.python("w1", *worker_argv(broker, topics, "jobs", "w1", hang_after=2))
        held = json.loads(worker.wait_for(r'"event": "holding"', 60)[0])["id"]
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait()
        assert held in sent

        # No tracker runs: the held message stays in flight past two leases; the idle
        # queue's message is never started.
        summary = _until(
            out, lambda s: _stuck(s).get(held) == "in_flight_too_long"
            and _stuck(s).get(idle) == "never_started",
            120, "the killed worker's message and the idle one flagged stuck", failure,
        )  # fmt: skip
        assert not failure, failure
        assert set(_stuck(summary)) == {held, idle}, summary["stuck"]
        assert summary["current"]["jobs"]["in_flight"] == 1
        assert summary["window"]["jobs"]["acked"] == 2
        assert summary["window"]["jobs"]["latency_ms"]["processing_ms"]["count"] == 2
        assert 'kmq_audit_stuck_messages{queue="jobs"} 1' in prom.read_text()
        assert '<meta http-equiv="refresh" content="1">' in (out / "report.html").read_text()
        flagged_after_s = time.monotonic() - started
        print(f"flagged after {flagged_after_s:.1f} s")

        # The tracker redelivers it (lease expired) and a second worker acks the copy.
        running = RunningTracker(tracker_config)
        try:
            children.python("w2", *worker_argv(broker, topics, "jobs", "w2"))
            summary = _until(
                out, lambda s: held not in _stuck(s) and s["window"]["jobs"]["acked"] == 3,
                90, "the redelivered copy acked and the flag cleared", failure,
            )  # fmt: skip
        finally:
            running.stop()
        print(f"cleared after {time.monotonic() - started:.1f} s")
        assert summary["window"]["jobs"]["redelivered"] == 1
        assert summary["current"].get("jobs", {}).get("in_flight", 0) == 0  # or evicted
        assert _stuck(summary) == {idle: "never_started"}

        # Bad records were counted, and settled messages leave the state.
        summary = _until(
            out, lambda s: s["bad_input"].get("orphan_end") == 1 and s["state"]["messages"] == 1,
            60, "the orphaned END counted and the settled messages evicted", failure,
        )  # fmt: skip
        assert summary["bad_input"]["undecodable"] == 1
        assert summary["bad_input"]["unknown_version"] == 1
        assert summary["bad_input"]["unknown_type"] == 1
        assert summary["markers"]["INVALID"] == 2 and summary["markers"]["UNKNOWN_42"] == 1
        assert summary["window"]["jobs"]["sent"] == 3  # counted once, though evicted
        assert not failure, failure
        print(f"flagged after {flagged_after_s:.1f} s; total {time.monotonic() - started:.1f} s")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
