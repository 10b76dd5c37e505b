"""Crashes, restarts, fail-over, bad input: what the kafka-mq-go suite does not cover."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaTimeoutError

import kmq
import tracker.reread as tracker_reread
from kmq.dev.embedded import free_port
from kmq.marker_writer import marker_partition
from kmq.markers import Marker, MarkerType, decode_all, encode, parse
from kmq.markers_v1 import encode_v1
from kmq.records import parse_queue_headers
from tests.functional.conftest import (
    REDELIVERY_TIMEOUT_S,
    Broker,
    RunningTracker,
    Topics,
    tracker_argv,
    worker_argv,
)
from tests.functional.helpers import (
    Child,
    Children,
    event_count,
    get,
    metric,
    parse_metrics,
    read_markers,
    read_records,
    wait_until,
)
from tracker.config import TrackerConfig
from tracker.daemon import Tracker
from tracker.fencing import transactional_id
from tracker.handover import parse_beacon, parse_tick


def receive_each(consumer: kmq.Consumer, ids: set[str], timeout_s: float) -> list[kmq.Message]:
    """Every message received until each of ``ids`` has been, duplicates included (to be
    settled too). A copy nobody was heard reading is copied again toward a consumer that
    is (tracker "copy not read"), and the first copy is still read once its partition is
    given to one: at-least-once allows that duplicate, and counting messages instead of ids
    stopped at 8 with one of the 8 never seen (a fresh-clone failure, twice)."""
    got: list[kmq.Message] = []
    deadline = time.monotonic() + timeout_s
    while not ids <= {m.id for m in got} and time.monotonic() < deadline:
        msg = consumer.receive(timeout_s=0.2)
        if msg is not None:
            got.append(msg)
    return got


def receive_all(consumer: kmq.Consumer, count: int, timeout_s: float) -> list[kmq.Message]:
    got: list[kmq.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.receive(timeout_s=0.2)
        if msg is not None:
            got.append(msg)
    return got


def test_worker_killed_mid_message_is_redelivered_then_acked(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker, children: Children
) -> None:
    q = service.queue("jobs")
    sent = q.producer().send(b"work")
    worker = children.python("worker", *worker_argv(broker, topics, "jobs", "w1", hang_after=0))
    worker.wait_for(r'"event": "holding"', 30)
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None
        assert (msg.id, msg.attempt, msg.payload) == (sent, 2, b"work")
        msg.ack()
        assert consumer.receive(timeout_s=2) is None
    assert tracker.stats()["redeliveries"] == 1


def test_keepalive_lets_a_worker_hold_a_message_three_timeouts(
    service: kmq.Service, tracker: Tracker
) -> None:
    q = service.queue("slow")
    q.producer().send(b"slow")
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None
        held_s = 3 * service.config.redelivery_timeout_s
        # Nothing may come back while we hold it; receive() returns early on any copy.
        assert consumer.receive(timeout_s=held_s) is None
        assert tracker.stats()["keepalive"] >= 3
        msg.ack()
    wait_until(lambda: tracker.stats()["end"] == 1, 10, "the END to reach the tracker")
    assert tracker.stats()["redeliveries"] == 0


def assert_nacked_message_comes_back(q: kmq.Queue) -> None:
    """Send one message, nack it, and get it back as attempt 2 (the tracker is working)."""
    sent = q.producer().send(b"again")
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None
        msg.nack()
        again = consumer.receive(timeout_s=10)
        assert again is not None and (again.id, again.attempt) == (sent, 2)
        again.ack()


def ready(port: int) -> bool:
    """The tracker serving probes on ``port`` is a settled member that has caught up."""
    return get(port, "/readyz")[0] == 200


def redeliveries(port: int) -> float:
    return metric(port, "kmq_tracker_redeliveries_total")


def partitions(port: int) -> float:
    return metric(port, "kmq_tracker_partitions_assigned")


def six_jobs_half_held(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
    hang_after: int,
    lease_s: float = REDELIVERY_TIMEOUT_S,
) -> tuple[set[str], Child, Child, int]:
    """Six messages on queue "jobs", a tracker process that has caught up (and serves its
    metrics on the port returned), and a worker that acks the first ``hang_after`` and holds
    the rest without settling them, on leases of ``lease_s``."""
    producer = service.queue("jobs").producer()
    sent = {producer.send(b"%d" % i) for i in range(6)}
    port = free_port()
    tracker = children.python("tracker-1", *tracker_argv(tracker_config, port))
    wait_until(lambda: ready(port), 30, "tracker-1 to catch up")
    worker = children.python(
        "worker",
        *worker_argv(broker, topics, "jobs", "w1", max_in_flight=6, hang_after=hang_after,
                     lease_s=lease_s),
    )  # fmt: skip
    worker.wait_for(r'"event": "holding"', 30, count=6 - hang_after)
    return sent, tracker, worker, port


def ack_copies(service: kmq.Service, sent: set[str]) -> None:
    """Receive every one of ``sent`` from queue "jobs", each as the tracker's copy (attempt
    2), and ack them."""
    with service.queue("jobs").consumer() as consumer:
        got = receive_each(consumer, sent, 30)
        assert {m.id for m in got} == sent and {m.attempt for m in got} == {2}
        for msg in got:
            msg.ack()


def test_tracker_restart_loses_nothing_and_redelivers_once(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    q = service.queue("jobs")
    sent, t1, worker, p1 = six_jobs_half_held(broker, topics, service, tracker_config, children, 3)
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    wait_until(lambda: redeliveries(p1) >= 3, 15, "tracker-1 to redeliver three")
    os.kill(t1.pid, signal.SIGKILL)  # crash right after redelivering: no clean commit
    t1.proc.wait()
    acked = {e["id"] for e in worker.events() if e["event"] == "acked"}
    assert len(acked) == 3

    p2 = free_port()
    t2 = children.python("tracker-2", *tracker_argv(tracker_config, p2))
    wait_until(lambda: ready(p2), 30, "tracker-2 to catch up")
    attempts: Counter[str] = Counter()
    with q.consumer() as consumer:
        for msg in receive_all(consumer, 3, 20):
            attempts[msg.id] = msg.attempt
            msg.ack()
        # A second redelivery would arrive within a timeout of the restart.
        assert consumer.receive(timeout_s=3 * tracker_config.default_redelivery_timeout_s) is None
    assert set(attempts) == sent - acked
    assert set(attempts.values()) == {2}
    assert redeliveries(p2) == 0
    t2.kill(signal.SIGTERM)
    assert t2.proc.returncode == 0
    assert not [line for line in t2.lines if ": redelivered " in line]
    redelivered = [m for m in read_markers(broker.bootstrap_servers, topics)
                   if m.type is MarkerType.REDELIVERED]  # fmt: skip
    assert sorted(m.message_id for m in redelivered) == sorted(sent - acked)


def test_surviving_tracker_takes_over_a_killed_replicas_partitions(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    ports = [free_port(), free_port()]
    replicas = [
        children.python(f"tracker-{i}", *tracker_argv(tracker_config, port))
        for i, port in enumerate(ports, 1)
    ]
    wait_until(lambda: all(partitions(port) >= 1 for port in ports), 30, "each replica to own one")
    q = service.queue("jobs")
    producer = q.producer()
    sent = {producer.send(b"%d" % i) for i in range(8)}
    worker = children.python(
        "worker", *worker_argv(broker, topics, "jobs", "w1", max_in_flight=8, hang_after=0)
    )
    worker.wait_for(r'"event": "holding"', 30, count=8)
    os.kill(replicas[0].pid, signal.SIGKILL)
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    with q.consumer() as consumer:
        got = receive_each(consumer, sent, 30)
        assert {m.id for m in got} == sent
        assert {m.attempt for m in got} == {2}
        for msg in got:
            msg.ack()
    wait_until(lambda: partitions(ports[1]) == 2, 5, "the survivor to own both partitions")


def held_leases_and_ticks(broker: Broker, topics: Topics) -> tuple[dict[Any, float], int]:
    """Per delivered record ``(lane, partition, offset)``, the write time (ms) of its last
    START or KEEPALIVE; and how many markers partitions hold a START or KEEPALIVE that no
    tick yet says was on the broker."""
    last: dict[Any, float] = {}
    last_offset: dict[int, int] = {}
    covered: dict[int, int] = {}
    for record in read_records(broker.bootstrap_servers, topics.markers):
        entries, texts = parse(record.value)
        for entry, text in zip(entries, texts, strict=True):
            if entry[0] in (MarkerType.START, MarkerType.KEEPALIVE):
                last[(entry[1], entry[2], entry[3])] = record.timestamp
                last_offset[record.partition] = record.offset
            tick = parse_tick(entry[3], text) if entry[0] == MarkerType.PROBE else None
            if tick is not None:
                covered[record.partition] = max(covered.get(record.partition, -1), tick[0])
    uncovered = sum(covered.get(p, -1) <= offset for p, offset in last_offset.items())
    return last, uncovered


def test_a_successor_runs_the_leases_it_replays_from_the_ticks_not_afresh(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    """A worker dies, and half a lease later the tracker: its successor replays the dead
    worker's leases of 10 s. By its predecessor's ticks it knows half of each had run
    already, and does not start them afresh (the time nobody owned the partition still
    counts: no clock of another process tells how long that was)."""
    lease_s = 10.0
    ticking = dataclasses.replace(tracker_config, tick_interval_s=0.2)
    sent, t1, worker, _ = six_jobs_half_held(
        broker, topics, service, ticking, children, 0, lease_s=lease_s
    )
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    time.sleep(lease_s / 2)  # the scenario, not a wait: tracker-1 outlives the worker a while
    wait_until(lambda: held_leases_and_ticks(broker, topics)[1] == 0, 10,
               "a tick after the worker's last marker")  # fmt: skip
    os.kill(t1.pid, signal.SIGKILL)
    t1.proc.wait()
    p2 = free_port()
    children.python("tracker-2", *tracker_argv(tracker_config, p2))
    wait_until(lambda: ready(p2), 30, "tracker-2 to catch up")
    caught_up = time.monotonic()
    wait_until(lambda: redeliveries(p2) >= 6, 2 * lease_s, "the successor's redeliveries")
    # Started afresh, the leases would end a whole lease after the replay; taken over, half a
    # lease (what ran of it while tracker-1 lived) sooner.
    assert time.monotonic() - caught_up < lease_s - 3
    assert redeliveries(p2) == 6
    last, _ = held_leases_and_ticks(broker, topics)
    redelivered = [
        (m, record.timestamp)
        for record in read_records(broker.bootstrap_servers, topics.markers)
        for m in decode_all(record.value)
        if m.type is MarkerType.REDELIVERED
    ]
    assert len(redelivered) == 6
    for m, at in redelivered:  # never before the lease ran out
        assert at >= last[(m.lane, m.partition, m.offset)] + lease_s * 1000
    ack_copies(service, sent)


def owned(port: int) -> set[int]:
    """The markers partitions the tracker serving ``port`` owns (its per-partition gauges)."""
    status, body = get(port, "/metrics")
    samples = parse_metrics(body).get("kmq_tracker_in_flight_messages", {}) if status == 200 else {}
    return {int(dict(labels)["partition"]) for labels in samples}


def second_tracker(
    config: TrackerConfig, children: Children, p1: int, heard: str
) -> tuple[Child, int]:
    """A second tracker beside the one serving ``p1``: returned (with its metrics port) once
    each owns a markers partition and has counted ``heard`` four times more."""
    p2 = free_port()
    t2 = children.python("tracker-2", *tracker_argv(config, p2))
    wait_until(lambda: ready(p1) and ready(p2) and len(owned(p1)) == len(owned(p2)) == 1, 60,
               "the two trackers to own a markers partition each")  # fmt: skip
    seen = {p: event_count(p, heard) for p in (p1, p2)}
    wait_until(lambda: all(event_count(p, heard) >= n + 4 for p, n in seen.items()), 10,
               f"each tracker to count {heard}")  # fmt: skip
    return t2, p2


def one_of_two_trackers_killed(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    config: TrackerConfig,
    children: Children,
    lease_s: float,
    heard: str,
) -> tuple[set[str], int, set[int], float]:
    """Six messages held by a worker on leases of ``lease_s``, two trackers owning a markers
    partition each and having read each other's ``heard`` event four times more; then the
    worker and the tracker whose partition holds more of the held messages SIGKILLed.
    Returns the messages, the survivor's metrics port, the dead one's partitions and when
    it was killed."""
    sent, t1, worker, p1 = six_jobs_half_held(broker, topics, service, config, children, 0,
                                              lease_s=lease_s)  # fmt: skip
    t2, p2 = second_tracker(config, children, p1, heard)
    held_on = Counter(
        record.partition
        for record in read_records(broker.bootstrap_servers, topics.markers)
        for m in decode_all(record.value)
        if m.type is MarkerType.START
    )
    dead, survivor = (t1, p2) if max(held_on, key=held_on.__getitem__) in owned(p1) else (t2, p1)
    dead_partitions = owned(p1 if dead is t1 else p2)
    os.kill(worker.pid, signal.SIGKILL)
    os.kill(dead.pid, signal.SIGKILL)
    killed = time.monotonic()
    worker.proc.wait()
    dead.proc.wait()
    return sent, survivor, dead_partitions, killed


def late_redeliveries_ms(
    broker: Broker, topics: Topics, partitions: set[int], lease_s: float
) -> list[float]:
    """How long after its lease ran out (its last START or KEEPALIVE's write time plus
    ``lease_s``) each REDELIVERED marker on ``partitions`` was written."""
    last, _ = held_leases_and_ticks(broker, topics)
    return [
        record.timestamp - (last[(m.lane, m.partition, m.offset)] + lease_s * 1000)
        for record in read_records(broker.bootstrap_servers, topics.markers)
        for m in decode_all(record.value)
        if m.type is MarkerType.REDELIVERED and record.partition in partitions
    ]


def test_a_surviving_tracker_runs_a_dead_trackers_leases_from_their_markers(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    """A worker and one of two trackers die together. The survivor had read the dead one's
    beacons, so it knows how far apart their clocks were: it redelivers the dead worker's
    messages a lease after their last markers, not a lease after it took their partition
    over (a session timeout and a group join later). The lease is long enough (20 s, kept
    alive every 6.7 s) that every deadline comes after the take-over."""
    lease_s = 20.0
    config = dataclasses.replace(
        tracker_config,
        tick_interval_s=0.2,
        session_timeout_ms=max(4000, tracker_config.session_timeout_ms),
    )
    _, survivor, dead_partitions, _ = one_of_two_trackers_killed(
        broker, topics, service, config, children, lease_s, "beacon_read"
    )
    wait_until(lambda: redeliveries(survivor) >= 6, 3 * lease_s, "the survivor's redeliveries")
    late_ms = late_redeliveries_ms(broker, topics, dead_partitions, lease_s)
    assert len(late_ms) >= 3 and all(late >= 0 for late in late_ms), late_ms  # never early
    # Without beacons: at least a session timeout (4 s) after the last markers, less a tick.
    assert max(late_ms) < 2500, late_ms


def test_a_killed_trackers_partitions_are_adopted_long_before_its_session_ends(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    """A worker and one of two trackers die together, the trackers' session being 15 s: the
    group would move the dead one's markers partition only after that. The survivor reads
    no beacon of it for ``adopt_after_s`` (2 s), takes the partition up itself and
    redelivers its leases within seconds, never before they ran out, each once."""
    config = dataclasses.replace(
        tracker_config, tick_interval_s=0.2, session_timeout_ms=15_000, adopt_after_s=2.0
    )
    sent, survivor, dead_partitions, killed = one_of_two_trackers_killed(
        broker, topics, service, config, children, REDELIVERY_TIMEOUT_S, "owns_read"
    )
    wait_until(lambda: redeliveries(survivor) >= 6, 12, "the survivor's redeliveries")
    # Adoption (2-3 s of silence, a claim, a replay and a probe; about 3 s here), not the
    # 15 s session: the group has not moved the partition yet.
    assert time.monotonic() - killed < 8
    assert event_count(survivor, "partitions_adopted") == len(dead_partitions) == 1
    assert owned(survivor) == {0, 1}
    late_ms = late_redeliveries_ms(broker, topics, dead_partitions, REDELIVERY_TIMEOUT_S)
    assert len(late_ms) >= 3 and all(late >= 0 for late in late_ms), late_ms  # never early
    copies = Counter(
        message_id for message_id, attempt in queue_records(broker, topics.retry) if attempt > 1
    )
    assert copies == Counter(sent), "each lease redelivered exactly once"


OPEN_TRANSACTION = """
import sys, time
from kafka import KafkaProducer
from kmq.markers import MarkerType, encode_entries
bootstrap, txn_id, topic, partitions = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all")
p.init_transactions()
p.begin_transaction()
probe = encode_entries([(int(MarkerType.PROBE), 0, 0, 0, 12345, 0, 0, 0)], [])
for partition in partitions.split(","):
    p.send(topic, value=probe, partition=int(partition))
p.flush()
print("open", flush=True)
time.sleep(600)
"""
"""Claims a markers partition's transactional id, begins a transaction on the given markers
partitions, writes to each and waits to be killed: what a replica killed in the middle of a
redelivery round leaves behind."""


def test_a_survivor_held_by_a_dead_trackers_open_transaction_still_adopts_its_partition(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    """One of two trackers is killed, and its transaction is left open on its own markers
    partition and the survivor's: the survivor reads its own partition no further (its own
    beacons do not come back), so by them it could never tell that the dead one is silent,
    and would wait out the 20 s session. It reads the owns entries past the hold
    (tracker.peek), adopts the dead one's partition after ``adopt_after_s``, and the claim
    ends the transaction. (On the embedded broker a dead replica's transaction holds every
    replica's partitions this way as soon as their redelivery rounds share a retry partition
    with it: Tansu 0.6 finishes no transaction that overlaps one still open.)"""
    config = dataclasses.replace(
        tracker_config, tick_interval_s=0.2, session_timeout_ms=20_000, adopt_after_s=6.0
    )
    sent, t1, worker, p1 = six_jobs_half_held(broker, topics, service, config, children, 0)
    _, p2 = second_tracker(config, children, p1, "owns_read")
    (dead_partition,), (kept,) = owned(p1), owned(p2)
    os.kill(t1.pid, signal.SIGKILL)
    killed = time.monotonic()
    t1.proc.wait()
    txn = children.python(
        "open-transaction", "-c", OPEN_TRANSACTION, broker.bootstrap_servers,
        transactional_id(config.group_id, config.marker_topic, dead_partition),
        config.marker_topic, f"{dead_partition},{kept}",
    )  # fmt: skip
    txn.wait_for("open", 30)
    os.kill(txn.pid, signal.SIGKILL)
    os.kill(worker.pid, signal.SIGKILL)
    txn.proc.wait()
    worker.proc.wait()
    assert time.monotonic() - killed < config.adopt_after_s, "held before it could adopt"
    wait_until(lambda: event_count(p2, "partitions_adopted") >= 1, 14, "the adoption")
    assert time.monotonic() - killed < 14, "adopted, not moved by the group after 20 s"
    assert event_count(p2, "owns_peeked") > 0, "judged by the owns entries past the hold"
    wait_until(lambda: redeliveries(p2) >= 6, 15, "the survivor's redeliveries")
    assert owned(p2) == {dead_partition, kept}
    late_ms = late_redeliveries_ms(broker, topics, {dead_partition, kept}, REDELIVERY_TIMEOUT_S)
    assert len(late_ms) == 6 and all(late >= 0 for late in late_ms), late_ms  # never early
    copies = Counter(
        message_id for message_id, attempt in queue_records(broker, topics.retry) if attempt > 1
    )
    assert copies == Counter(sent), "each lease redelivered exactly once"


def beacon_clocks_covering(broker: Broker, topics: Topics, partition: int) -> set[int]:
    """The clocks whose beacons on markers ``partition`` carry a tick past its last START or
    KEEPALIVE: each such beacon says that marker was on the broker by a time on its clock."""
    last = -1
    ticks: list[tuple[int, int]] = []  # (clock, acked offset)
    for record in read_records(broker.bootstrap_servers, topics.markers):
        if record.partition != partition:
            continue
        entries, texts = parse(record.value)
        for entry, text in zip(entries, texts, strict=True):
            if entry[0] in (MarkerType.START, MarkerType.KEEPALIVE):
                last = record.offset
            beacon = parse_beacon(entry[3], text) if entry[0] == MarkerType.PROBE else None
            if beacon is not None and beacon[2] is not None:
                ticks.append((beacon[0], beacon[2][0]))
    return {clock for clock, acked in ticks if acked > last} if last >= 0 else set()


def test_a_replica_that_held_nothing_runs_replayed_leases_from_its_own_beacons(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    """Three trackers on two markers partitions: one holds none, so it reads no other
    replica's beacons and knows no other clock. It writes beacons to both partitions all
    the same. A worker holding six messages on 30 s leases (kept alive every 10 s) dies,
    then both other trackers; the group gives both partitions to the idle one (adoption
    off) a session timeout (6 s) and a join later, well before any of those leases runs
    out. Only its own beacons in the replay bound, on a clock it knows, when the dead
    worker's markers were on the broker: it redelivers them a lease after those markers,
    never before. The dead trackers' ticks alone, their clocks known only from the replay,
    bound them no closer than how long the partitions had no owner (the session timeout,
    and more)."""
    lease_s = 30.0
    config = dataclasses.replace(
        tracker_config,
        tick_interval_s=0.2,
        adopt_after_s=0,
        session_timeout_ms=max(6000, tracker_config.session_timeout_ms),
    )
    sent, t1, worker, p1 = six_jobs_half_held(broker, topics, service, config, children, 0,
                                              lease_s=lease_s)  # fmt: skip
    ports: dict[Child, int] = {t1: p1}
    for name in ("tracker-2", "tracker-3"):
        port = free_port()
        ports[children.python(name, *tracker_argv(config, port))] = port

    def settled() -> dict[Child, set[int]] | None:
        """Who owns what, once all three are settled members and two own one each."""
        if not all(ready(port) for port in ports.values()):
            return None
        owns = {tracker: owned(port) for tracker, port in ports.items()}
        return owns if sorted(map(len, owns.values())) == [0, 1, 1] else None

    owns = wait_until(settled, 60, "two trackers to own a markers partition each, one none")
    idle = next(tracker for tracker, partitions in owns.items() if not partitions)
    port = ports[idle]
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    # Every replica beacons to every partition: once three clocks' beacons tick past the
    # dead worker's last marker in each partition it wrote to, one of them is the idle
    # replica's. Six message ids all hash to one of two partitions once in 32 runs; the
    # other then holds no marker of the worker for a beacon to tick past.
    count = service.marker_partition_count()
    held = {marker_partition(message_id, count) for message_id in sent}
    wait_until(lambda: all(len(beacon_clocks_covering(broker, topics, p)) >= 3 for p in held),
               10, "a beacon of each replica after the worker's last marker")  # fmt: skip
    others = [tracker for tracker in ports if tracker is not idle]
    for dead in others:
        os.kill(dead.pid, signal.SIGKILL)
    for dead in others:
        dead.proc.wait()
    wait_until(lambda: owned(port) == {0, 1}, 30, "the idle replica to take both partitions")
    wait_until(lambda: redeliveries(port) >= 6, 2 * lease_s, "the idle replica's redeliveries")
    assert event_count(port, "lease_taken_over") >= 6
    late_ms = late_redeliveries_ms(broker, topics, {0, 1}, lease_s)
    assert len(late_ms) == 6 and all(late >= 0 for late in late_ms), late_ms  # never early
    # Bound by its own beacons (one a second): about a second (1.0 to 1.2 s here). By the
    # dead trackers' ticks alone: at least the 6 s session timeout (9.9 s here).
    assert max(late_ms) < 4000, late_ms
    ack_copies(service, sent)


def test_a_tracker_frozen_past_its_session_does_not_redeliver_on_waking(
    broker: Broker,
    topics: Topics,
    service: kmq.Service,
    tracker_config: TrackerConfig,
    children: Children,
) -> None:
    """A zombie: frozen (SIGSTOP) while it owned every partition, its successor redelivers the
    expired leases; on waking (SIGCONT) its state says they are all overdue, but it must not
    redeliver them a second time: the successor's claim of each markers partition fenced
    its redelivery transactions."""
    sent, zombie, worker, port = six_jobs_half_held(
        broker, topics, service, tracker_config, children, 0
    )
    wait_until(  # it holds all six leases
        lambda: metric(port, "kmq_tracker_in_flight_messages") == 6, 10, "six in flight"
    )
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait()
        successor_port = free_port()
        children.python("tracker-2", *tracker_argv(tracker_config, successor_port))
        wait_until(lambda: redeliveries(successor_port) >= 6, 30, "the successor's redeliveries")
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    # Awake, it finds out it was replaced (fenced, or told by the group), rejoins and gets a
    # share of the partitions again: a zombie recovers by itself.
    wait_until(
        lambda: event_count(port, "assignments") >= 2 and event_count(port, "caught_up") >= 2,
        30,
        "the zombie to be assigned partitions again and to catch up on them",
    )
    assert not [line for line in zombie.lines if ": redelivered " in line]
    copies = Counter(
        message_id for message_id, attempt in queue_records(broker, topics.retry) if attempt > 1
    )
    assert copies == Counter(sent), "each lease redelivered exactly once"


def queue_records(broker: Broker, topic: str) -> list[tuple[str, int]]:
    """(message id, attempt) of every record on the queue topic."""
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[tuple[str, int]] = []

        def at_end() -> bool:
            for batch in consumer.poll(timeout_ms=200).values():
                for record in batch:
                    message_id, attempt, _ = parse_queue_headers(record.headers)
                    if message_id is not None:
                        out.append((message_id, attempt))
            ends = {tp: consumer.highwater(tp) for tp in tps}
            return all(end is not None and consumer.position(tp) >= end for tp, end in ends.items())

        wait_until(at_end, 10, f"the end of {topic}")
        return out
    finally:
        consumer.close()


def test_close_releases_held_and_buffered_messages_at_once(
    make_service: Callable[..., kmq.Service], tracker: Tracker
) -> None:
    service = make_service(redelivery_timeout_s=60.0)  # only a release can be this quick
    q = service.queue("jobs")
    producer = q.producer()
    sent = {producer.send(b"%d" % i) for i in range(3)}
    first = q.consumer(max_in_flight=5)
    held = first.receive(timeout_s=15)
    assert held is not None
    wait_until(lambda: first.in_flight == 3, 15, "all three messages to be buffered")
    closed_at = time.monotonic()
    first.close()
    with pytest.raises(kmq.MessageStateError):
        held.ack()
    with q.consumer() as second:
        got = receive_all(second, 3, 15)
        assert time.monotonic() - closed_at < 15
        assert {m.id for m in got} == sent
        attempts = {m.id: m.attempt for m in got}
        assert attempts[held.id] == 2  # it was handed out, so that try counts
        assert sorted(attempts.values()) == [1, 1, 2]  # buffered ones were never seen
        for msg in got:
            msg.ack()


def test_backpressure_caps_unsettled_messages(
    make_service: Callable[..., kmq.Service], tracker: Tracker
) -> None:
    # Counts in-flight messages exactly, so no copy may arrive: a lease a loaded machine
    # cannot miss (a 1 s one was, once, and a redelivered copy took a slot).
    q = make_service(redelivery_timeout_s=10.0).queue("bp")
    producer = q.producer()
    for i in range(5):
        producer.send(b"%d" % i, wait=False)
    producer.flush()
    with q.consumer(max_in_flight=2) as consumer:
        a, b = consumer.receive(timeout_s=15), consumer.receive(timeout_s=15)
        assert a is not None and b is not None
        assert consumer.receive(timeout_s=1.5) is None
        assert consumer.in_flight == 2
        a.ack()
        c = consumer.receive(timeout_s=15)
        assert c is not None
        assert consumer.in_flight == 2
        b.ack()
        c.ack()
        rest = receive_all(consumer, 2, 15)
        got = [m.id for m in (a, b, c, *rest)]
        assert len(got) == len(set(got)) == 5, f"not 5 distinct messages: {got}"
        for msg in rest:
            msg.ack()
        assert consumer.in_flight == 0


def test_settling_twice_raises(service: kmq.Service, tracker: Tracker) -> None:
    q = service.queue("twice")
    q.producer().send(b"x")
    q.producer().send(b"y")
    with q.consumer() as consumer:
        first, second = receive_all(consumer, 2, 15)
        first.ack()
        with pytest.raises(kmq.MessageStateError):
            first.ack()
        with pytest.raises(kmq.MessageStateError):
            first.nack()
        second.nack(delay_s=60)
        with pytest.raises(kmq.MessageStateError):
            second.ack()


def test_tracker_survives_garbage_on_the_markers_topic(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    start, end, keepalive = MarkerType.START, MarkerType.END, MarkerType.KEEPALIVE
    junk = [
        b"\xff\xfe not a marker",
        b"",
        b"\x02\x00\x00\x00\x05too short for five",
        encode(Marker(end, 0, 1)),  # unknown deliveries
        encode(Marker(keepalive, 0, 2, redeliver_after_ms=1000)),
        encode(Marker(start, 0, 3, redeliver_after_ms=0)),  # bad lease, twice: one duplicate
        encode(Marker(start, 0, 3, redeliver_after_ms=0)),
        encode(Marker(start, 0, 4, redeliver_after_ms=2**32 - 1)),  # absurd lease
        encode_v1(type=end, queue="q", partition=0, offset=5, message_id="old", attempt=1),
        encode_v1(type=start, queue="q", partition=0, offset=6, message_id="x", version=9),
        encode_v1(type=start, queue="q", partition=0, offset=7, message_id="", attempt=1),
    ]
    for partition in (0, 1):
        for value in junk:
            kp.send(topics.markers, value=value, partition=partition)
        kp.send(topics.markers, key=b"tombstone", value=None, partition=partition)
    kp.flush()
    kp.close()
    wait_until(lambda: tracker.stats()["bad_marker"] >= 10, 15, "the tracker to skip the junk")
    stats = tracker.stats()
    assert stats["unknown_delivery"] >= 6
    assert stats["duplicate_start"] >= 2
    assert stats["bad_lease"] >= 4
    # The STARTs name queue records that were never written: once their (default, 1 s)
    # leases run out, re-reading finds nothing, and they are counted, not redelivered.
    wait_until(lambda: tracker.stats()["record_missing"] >= 4, 15, "missing records counted")
    assert tracker.stats()["redeliveries"] == 0
    assert_nacked_message_comes_back(service.queue("after-junk"))  # still working


def queue_record(topic: str, queue: str, message_id: str, payload: bytes) -> dict[str, Any]:
    return {
        "topic": topic,
        "key": queue.encode(),
        "value": payload,
        "headers": [("kmq.id", message_id.encode())],
        "partition": 0,
    }


def test_a_re_read_cut_short_still_makes_progress(
    monkeypatch: pytest.MonkeyPatch, broker: Broker, topics: Topics, tracker: Tracker
) -> None:
    """The tracker re-reads a due delivery's record to redeliver it. On a slow broker that
    scan may not reach its end in time; what it did read must still be redelivered (a full
    run of the chaos suite once starved all redeliveries for 18 minutes)."""
    monkeypatch.setattr(tracker._records, "_scan_timeout_s", 0.0)  # one poll per scan
    monkeypatch.setattr(tracker_reread, "SCAN_RECORDS", 1)  # of one record
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    ids = [f"slow-scan-{i}" for i in range(3)]
    offsets = [
        kp.send(**queue_record(topics.queue, "jobs", mid, b"payload")).get(10).offset for mid in ids
    ]
    for offset in offsets:
        start = Marker(MarkerType.START, 0, offset, redeliver_after_ms=100)
        kp.send(topics.markers, value=encode(start), partition=0)  # one record each
    kp.flush()
    kp.close()
    wait_until(lambda: tracker.stats()["redeliveries"] >= 3, 20, "all three redeliveries")
    copies = Counter(mid for mid, attempt in queue_records(broker, topics.retry) if attempt == 2)
    assert copies == Counter(ids)


def test_an_old_start_marker_is_still_redelivered(
    broker: Broker, topics: Topics, tracker: Tracker
) -> None:
    """A version 1 START (kmq 0.1, with the payload inside) left on the markers topic by an
    upgrade is redelivered like a new one, from its queue record."""
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    offset = kp.send(**queue_record(topics.queue, "jobs", "old-one", b"old")).get(10).offset
    old = encode_v1(
        type=MarkerType.START, queue="jobs", partition=0, offset=offset, message_id="old-one",
        attempt=1, redeliver_after_ms=100, key=b"jobs", value=b"old",
    )  # fmt: skip
    kp.send(topics.markers, key=b"old-one", value=old, partition=0).get(10)
    kp.close()
    wait_until(lambda: tracker.stats()["redeliveries"] >= 1, 20, "the old START's redelivery")
    assert ("old-one", 2) in queue_records(broker, topics.retry)


def test_a_re_read_that_fails_is_retried(
    monkeypatch: pytest.MonkeyPatch, service: kmq.Service, tracker: Tracker
) -> None:
    real = tracker._records.read
    failures: list[int] = []

    def flaky(wanted: Any) -> Any:
        if not failures:
            failures.append(len(wanted))
            raise KafkaTimeoutError("injected: the re-read failed")
        return real(wanted)

    monkeypatch.setattr(tracker._records, "read", flaky)
    assert_nacked_message_comes_back(service.queue("reread"))
    assert failures, "the fault was never hit"


def test_oversize_payload_is_rejected_before_anything_is_written(
    broker: Broker, topics: Topics, make_service: Callable[..., kmq.Service], tracker: Tracker
) -> None:
    service = make_service(max_message_bytes=64 * 1024)
    q = service.queue("big")
    with pytest.raises(kmq.MessageTooLargeError):
        q.producer().send(b"x" * (64 * 1024))
    fits = b"y" * (60 * 1024)
    sent = q.producer().send(fits)
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    tps = [TopicPartition(topics.queue, p) for p in (0, 1)]
    reader.assign(tps)
    reader.seek_to_beginning(*tps)
    values: list[bytes] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not values:
        for batch in reader.poll(timeout_ms=200).values():
            values.extend(r.value for r in batch)
    reader.close()
    assert values == [fits]  # the rejected payload never reached the queue topic
    with q.consumer() as consumer:
        msg = consumer.receive(timeout_s=15)
        assert msg is not None and msg.id == sent and msg.payload == fits
        msg.ack()


def big_message_topics(broker: Broker, topics: Topics, limit: int) -> kmq.ServiceConfig:
    """A queue and a markers topic of their own that take records of up to ``limit`` bytes
    (a stock Apache Kafka takes 1 MB unless the topic says more); a config to match."""
    tag = f"{topics.queue}.big"
    config = kmq.ServiceConfig(
        bootstrap_servers=broker.bootstrap_servers,
        queue_topic=f"{tag}.queue",
        marker_topic=f"{tag}.markers",
        control_topic=topics.control,
        redelivery_timeout_s=1.0,
        session_timeout_ms=broker.session_timeout_ms,
        queue_partitions=1,
        marker_partitions=1,
        max_message_bytes=limit,
        create_topics=False,
    )
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        big = {"max.message.bytes": str(limit + 100_000)}
        admin.create_topics(
            [NewTopic(config.queue_topic, 1, 1, topic_configs=big),
             NewTopic(config.retry_topic, 1, 1, topic_configs=big),
             NewTopic(config.marker_topic, 1, 1, topic_configs=big)]
        )  # fmt: skip
    finally:
        admin.close()
    return config


def test_message_larger_than_kafka_pythons_default_limit_is_redelivered(
    broker: Broker, topics: Topics, tracker_config: TrackerConfig
) -> None:
    """A 2 MB message (kafka-python refuses records over 1 MiB unless told otherwise) under
    max_message_bytes=3 MB comes back after a nack: the tracker's producer takes its limit
    from its own max_message_bytes."""
    limit = 3_000_000
    config = big_message_topics(broker, topics, limit)
    running = RunningTracker(
        dataclasses.replace(
            tracker_config,
            queue_topic=config.queue_topic,
            retry_topic=config.retry_topic,
            marker_topic=config.marker_topic,
            group_id=f"tracker-{config.marker_topic}",
            max_message_bytes=limit,
        )
    )
    payload = os.urandom(2_000_000)
    try:
        assert running.tracker.wait_caught_up(30), "tracker never caught up"
        with kmq.Service(config) as svc:
            q = svc.queue("big")
            sent = q.producer().send(payload)
            with q.consumer() as consumer:
                first = consumer.receive(timeout_s=20)
                assert first is not None and first.id == sent and first.payload == payload
                first.nack(0.0, reason="once more")
                again = consumer.receive(timeout_s=20)
                assert again is not None, "the 2 MB message was not redelivered"
                assert (again.id, again.attempt) == (sent, 2)
                assert again.payload == payload
                again.ack()
        # A copy is readable before its round commits and counts it.
        wait_until(lambda: running.tracker.stats()["redeliveries"] == 1, 10, "it counted")
    finally:
        running.stop()


def test_a_two_megabyte_nack_reason_is_cut_and_the_consumer_carries_on(
    broker: Broker, topics: Topics, service: kmq.Service, tracker: Tracker
) -> None:
    """A reason bigger than the record limit used to make nack() raise kafka-python's
    MessageSizeTooLargeError and leave the marker stuck in the consumer's writer (close()
    raised it again)."""
    q = service.queue("verbose")
    sent = {q.producer().send(p) for p in (b"a", b"b")}
    got: list[tuple[str, int]] = []
    with q.consumer() as consumer:
        first = consumer.receive(timeout_s=15)
        assert first is not None
        first.nack(0.0, reason="x" * 2_000_000)
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            msg = consumer.receive(timeout_s=1)
            if msg is not None:
                got.append((msg.id, msg.attempt))
                msg.ack()
    other = (sent - {first.id}).pop()
    assert sorted(got) == sorted([(first.id, 2), (other, 1)])
    redelivered = [
        m for m in read_markers(broker.bootstrap_servers, topics)
        if m.type is MarkerType.REDELIVERED and m.message_id == first.id
    ]  # fmt: skip
    assert [m.reason for m in redelivered] == ["x" * 999 + "\u2026"]


def test_a_record_over_the_consumers_limit_is_still_delivered(
    broker: Broker, topics: Topics
) -> None:
    """A producer allowed 3 MB sends 2 MB; a consumer left at the 1 MB default still gets
    it: markers no longer carry the payload, so nothing the consumer writes grows with it
    (before, its START was refused and the consumer stopped)."""
    config = big_message_topics(broker, topics, 3_000_000)
    payload = os.urandom(2_000_000)
    with kmq.Service(config) as svc:
        sent = svc.queue("big").producer().send(payload)
    small = dataclasses.replace(config, max_message_bytes=1_000_000)
    with kmq.Service(small) as svc, svc.queue("big").consumer() as consumer:
        msg = consumer.receive(timeout_s=30)
        assert msg is not None and (msg.id, msg.payload) == (sent, payload)
        msg.ack()


def test_a_transaction_left_open_on_the_markers_is_reported_and_reading_resumes_when_it_ends(
    broker: Broker, topics: Topics, service: kmq.Service, tracker_config: TrackerConfig
) -> None:
    """A transaction nobody ends holds a markers partition's last stable offset: the tracker
    reads nothing past it. It must say so (an ERROR, ``/readyz``, a gauge) rather than sit
    silent, and carry on once the transaction ends."""
    hanging = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers,
        transactional_id=f"hang-{topics.markers}",
        transaction_timeout_ms=60_000,  # longer than the test: only the abort below ends it
    )
    hanging.init_transactions()
    hanging.begin_transaction()
    for partition in (0, 1):
        hanging.send(topics.markers, b"never committed", partition=partition)
    hanging.flush()
    running = RunningTracker(dataclasses.replace(tracker_config, stalled_after_s=1.0))
    try:
        q = service.queue("held")
        sent = q.producer().send(b"behind the open transaction")
        with q.consumer() as consumer:
            msg = consumer.receive(timeout_s=15)
            assert msg is not None and msg.id == sent
            msg.nack()  # its START and NACK lie past the open transaction

            def stalled() -> list[int]:
                return [p.partition for p in running.tracker.view().partitions if p.stalled_s]

            wait_until(lambda: len(stalled()) == 2, 20, "both markers partitions reported")
            problems = running.tracker.view().problems()
            assert any("reading stalled" in problem for problem in problems), problems
            assert running.tracker.stats()["stalled"] == 2
            assert consumer.receive(timeout_s=1.5) is None  # nothing redelivered meanwhile
            hanging.abort_transaction()
            again = consumer.receive(timeout_s=15)
            assert again is not None and (again.id, again.attempt) == (sent, 2)
            again.ack()
        assert running.tracker.wait_caught_up(10)
        wait_until(lambda: not stalled(), 10, "the stall over")
    finally:
        running.stop()
        hanging.close(timeout=1)
