"""Chaos: many messages over several queues while workers and trackers are SIGKILLed, the
network resets and stalls, and producers' and workers' clocks are minutes off.

The defaults are the reduced run that ``make test`` includes (a few minutes at most). Every
knob is an environment variable; ``make chaos`` runs the full one::

    KMQ_CHAOS_SEED          the seed of the kill and fault schedule (random, and printed, by
                            default); the same seed gives the same schedule
    KMQ_CHAOS_MESSAGES      messages to send (4000; full run 100000)
    KMQ_CHAOS_SECONDS       the chaos phase lasts at least this long, and until the
                            producers are done (75)
    KMQ_CHAOS_LEASE_S       the lease, redelivery_timeout_s (2.0)
    KMQ_CHAOS_WORKERS       worker processes, each consuming every queue (3)
    KMQ_CHAOS_TRACKERS      tracker replicas (2)
    KMQ_CHAOS_DRAIN_S       after the chaos, how long the settling of messages may make no
                            progress before the unsettled ones count as lost (120)
    KMQ_CHAOS_SESSION_TIMEOUT_MS
                            every group's session timeout (2000; full run 6000, because a
                            2-core machine saturated for half an hour misses 2 s heartbeats
                            and its groups then never stop rebalancing)
    KMQ_CHAOS_TRACKER_SESSION_TIMEOUT_MS
                            the trackers' group only (the one above; full run 3000: a
                            killed tracker's partitions wait this long, plus a join, before
                            another replica redelivers from them)
    KMQ_CHAOS_WORKER_KILL_EVERY_S, KMQ_CHAOS_TRACKER_KILL_EVERY_S
                            mean time between kills (5 and 15; full run 20 and 60, so the
                            groups get to settle between kills at 6 s sessions)
    KMQ_CHAOS_MAX_IN_FLIGHT, KMQ_CHAOS_HANDLERS
                            each worker consumer's max_in_flight and the threads that
                            receive from it (10 and 1; full run 40 and 4: a worker pool, so
                            the workers keep up with the producers between kills)
    KMQ_CHAOS_KEEP          1: keep the run's directory (ledgers, logs) even after a pass

What is checked, and how, is in :mod:`tests.chaos.ledger`. The run prints its seed and its
directory first and one ``chaos summary:`` line last; a failed run keeps its directory, with
``chaos-details.txt``, ``run.json`` (kills and faults), ``ledgers/`` and ``logs/``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

import kmq
from kmq.config import retry_topic_for
from kmq.dev.embedded import EmbeddedBroker, free_port
from kmq.topics import ensure_topics
from tests.chaos.ledger import (
    Incarnation,
    Ledgers,
    MarkerLog,
    QueueLog,
    Report,
    RunLog,
    TailStalled,
    TopicTail,
    check,
    committed_stops,
    lost_behind,
    read_ledgers,
)
from tests.chaos.proxy import FaultProxy
from tests.chaos.roles import SEND_TRIES
from tests.functional.conftest import tracker_argv
from tests.functional.helpers import Child, Children, event_count, wait_until
from tracker.config import TrackerConfig

ROOT = Path(__file__).resolve().parents[2]
QUEUE_TOPIC = "chaos.queue"
MARKER_TOPIC = "chaos.markers"
PARTITIONS = 4
WORKER_SKEWS_S = (300.0, -300.0, 150.0, -150.0, 450.0, -450.0, 600.0, -600.0)
PRODUCER_SKEWS_S = (240.0, -240.0)
"""Clock skews by slot: at least 150 s apart, so a START's writer can be told by its stamp."""


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


@dataclass(frozen=True)
class Params:
    seed: int
    messages: int
    chaos_s: float
    lease_s: float
    workers: int
    trackers: int
    drain_s: float
    session_timeout_ms: int = 2000
    """Tansu settles a group in about half the session timeout."""
    tracker_session_timeout_ms: int = 2000
    """The trackers' group's (from the environment: ``session_timeout_ms`` unless set)."""
    queues: int = 4
    producers: int = len(PRODUCER_SKEWS_S)
    worker_max_in_flight: int = 10
    worker_handlers: int = 1
    """Threads per queue in each worker, each receiving and "processing" one message at a time."""
    worker_max_work_ms: float = 100.0
    """Each message takes 0 to this long to "process", so a SIGKILL often catches some held."""
    nack_probability: float = 0.03
    worker_kill_every_s: float = 5.0
    tracker_kill_every_s: float = 15.0
    reset_every_s: float = 9.0
    stall_every_s: float = 11.0
    max_stall_s: float = 3.0
    """Stalls last 0.2 s to this long; over 2/3 of the lease they cause redeliveries."""
    tracker_rebalance: str = TrackerConfig.rebalance

    @classmethod
    def from_env(cls) -> Params:
        seed_raw = os.environ.get("KMQ_CHAOS_SEED")
        session_ms = int(_env_number("KMQ_CHAOS_SESSION_TIMEOUT_MS", 2000))
        return cls(
            seed=int(seed_raw) if seed_raw else random.SystemRandom().randrange(1 << 31),
            messages=int(_env_number("KMQ_CHAOS_MESSAGES", 4000)),
            chaos_s=_env_number("KMQ_CHAOS_SECONDS", 75.0),
            lease_s=_env_number("KMQ_CHAOS_LEASE_S", 2.0),
            workers=int(_env_number("KMQ_CHAOS_WORKERS", 3)),
            trackers=int(_env_number("KMQ_CHAOS_TRACKERS", 2)),
            drain_s=_env_number("KMQ_CHAOS_DRAIN_S", 120.0),
            session_timeout_ms=session_ms,
            tracker_session_timeout_ms=int(
                _env_number("KMQ_CHAOS_TRACKER_SESSION_TIMEOUT_MS", session_ms)
            ),
            worker_kill_every_s=_env_number("KMQ_CHAOS_WORKER_KILL_EVERY_S", 5.0),
            tracker_kill_every_s=_env_number("KMQ_CHAOS_TRACKER_KILL_EVERY_S", 15.0),
            worker_max_in_flight=int(_env_number("KMQ_CHAOS_MAX_IN_FLIGHT", 10)),
            worker_handlers=int(_env_number("KMQ_CHAOS_HANDLERS", 1)),
            tracker_rebalance=os.environ.get("KMQ_CHAOS_TRACKER_REBALANCE")
            or TrackerConfig.rebalance,
        )

    @property
    def rate(self) -> float:
        """Messages per second per producer: sending spans 80 % of the chaos phase."""
        return self.messages / (0.8 * self.chaos_s) / self.producers

    @property
    def chaos_cap_s(self) -> float:
        """The chaos phase ends here even if the producers are not done."""
        return 1.5 * self.chaos_s + 30

    @property
    def drain_cap_s(self) -> float:
        """The drain ends here even if messages are still being settled. Generous: a full
        run leaves a backlog, and late in it the in-memory broker answers a fetch in 0.2 to
        1 s, so the workers settle only about a dozen messages a second."""
        return self.drain_s + self.messages / 25

    @property
    def fault_grace_s(self) -> float:
        """After a fault: a session timeout, a group join, and a lease of catching up."""
        return (
            2 * max(self.session_timeout_ms, self.tracker_session_timeout_ms) / 1000 + self.lease_s
        )

    @property
    def timeout_s(self) -> float:
        """pytest-timeout's limit: only a hang gets near it."""
        setup_s, final_s = 90, 90 + self.messages / 500
        return setup_s + 2 * self.chaos_cap_s + self.drain_cap_s + final_s

    @property
    def overload_tolerance(self) -> int:
        """Redeliveries blamed on CPU starvation that still pass (see tests.chaos.ledger)."""
        return max(10, self.messages // 100)

    def describe(self) -> str:
        return (
            f"queues={self.queues} workers={self.workers} trackers={self.trackers} "
            f"producers={self.producers} lease={self.lease_s:g}s chaos={self.chaos_s:g}s "
            f"session={self.session_timeout_ms}ms "
            f"tracker_session={self.tracker_session_timeout_ms}ms "
            f"kill_every={self.worker_kill_every_s:g}s/"
            f"{self.tracker_kill_every_s:g}s in_flight={self.worker_max_in_flight} "
            f"handlers={self.worker_handlers} tracker_rebalance={self.tracker_rebalance}"
        )


PARAMS = Params.from_env()


@dataclass
class Slot:
    """A process position (worker 0, tracker 1, ...) whose incarnations come and go."""

    kind: str
    index: int
    skew_s: float
    child: Child | None = None
    incarnation: Incarnation | None = None
    generations: int = 0
    restart_at: float | None = None
    """Monotonic time to start the next incarnation after a kill."""


@dataclass
class Cluster:
    """Every chaos child process by slot. Each incarnation is recorded for the ledger."""

    children: Children
    argv: Callable[[Slot, str], list[str]]
    slots: list[Slot] = field(default_factory=list)
    incarnations: list[Incarnation] = field(default_factory=list)

    def add(self, kind: str, count: int, skews: tuple[float, ...] = ()) -> list[Slot]:
        new = [Slot(kind, i, skews[i % len(skews)] if skews else 0.0) for i in range(count)]
        self.slots.extend(new)
        return new

    def of(self, kind: str) -> list[Slot]:
        return [s for s in self.slots if s.kind == kind]

    def spawn(self, slot: Slot) -> Child:
        slot.generations += 1
        name = f"{slot.kind[0]}{slot.index}.{slot.generations}"
        inc = Incarnation(name, slot.kind, slot.index, slot.skew_s, time.time())
        slot.child = self.children.python(name, *self.argv(slot, name))
        slot.incarnation, slot.restart_at = inc, None
        self.incarnations.append(inc)
        return slot.child

    def kill(self, slot: Slot, *, restart_after_s: float | None, chaos: bool = True) -> None:
        """SIGKILL the slot's process (by PID); optionally schedule its next incarnation."""
        child, inc = slot.child, slot.incarnation
        if child is not None and inc is not None and child.proc.poll() is None:
            now = time.time()
            os.kill(child.pid, signal.SIGKILL)
            child.proc.wait(timeout=30)
            if chaos:
                inc.killed = now
            else:
                inc.stopped = now
        slot.child = None
        if restart_after_s is not None:
            slot.restart_at = time.monotonic() + restart_after_s

    def reap(self) -> list[Incarnation]:
        """Incarnations whose process ended by itself since the last call."""
        ended = []
        for slot in self.slots:
            if slot.child is None or slot.incarnation is None:
                continue
            code = slot.child.proc.poll()
            if code is not None:
                slot.incarnation.exit_code, slot.incarnation.stopped = code, time.time()
                slot.child = None
                ended.append(slot.incarnation)
        return ended

    def restart_due(self, *, all_now: bool = False) -> None:
        for slot in self.slots:
            if slot.restart_at is not None and (all_now or time.monotonic() >= slot.restart_at):
                self.spawn(slot)


def _sayer(capsys: pytest.CaptureFixture[str]) -> Callable[[str], None]:
    """Print past pytest's output capture: the seed and the summary always show."""

    def say(line: str) -> None:
        with capsys.disabled():
            print(line, flush=True)

    return say


class Chaos:
    """The time-driven fault schedule: each kind of event is a Poisson process.

    Every event draws the same numbers whatever the state, so a seed fixes the schedule:
    which event comes when, whom it hits, how long it lasts. An event whose target is not
    there (a worker already down) is skipped. How the schedule meets the traffic varies.
    """

    KINDS = ("worker_kill", "tracker_kill", "reset", "stall")

    def __init__(
        self, params: Params, rng: random.Random, cluster: Cluster, proxy: FaultProxy
    ) -> None:
        self.params, self.rng, self.cluster, self.proxy = params, rng, cluster, proxy
        self.stall_thread: threading.Thread | None = None
        now = time.monotonic()
        # The first of each kind falls early, so even a short run sees every kind.
        early_s = min(params.chaos_s, 60)
        self.next_at = {kind: now + rng.uniform(0.1, 0.35) * early_s for kind in self.KINDS}
        self.every = {
            "worker_kill": params.worker_kill_every_s,
            "tracker_kill": params.tracker_kill_every_s,
            "reset": params.reset_every_s,
            "stall": params.stall_every_s,
        }

    def tick(self) -> float:
        """Perform what is due; return the monotonic time of the next scheduled event."""
        self.cluster.restart_due()
        now = time.monotonic()
        for kind in self.KINDS:
            if now >= self.next_at[kind]:
                getattr(self, kind)(random.Random(self.rng.random()))
                self.next_at[kind] = now + self.rng.expovariate(1 / self.every[kind])
        pending = [s.restart_at for s in self.cluster.slots if s.restart_at is not None]
        return min([*self.next_at.values(), *pending])

    def worker_kill(self, rng: random.Random) -> None:
        workers = self.cluster.of("worker")
        target, restart_after_s = rng.choice(workers), rng.uniform(0, 2)
        up = [s for s in workers if s.child is not None]
        if target in up and len(up) > 1:  # leave one worker running
            self.cluster.kill(target, restart_after_s=restart_after_s)

    def tracker_kill(self, rng: random.Random) -> None:
        trackers = self.cluster.of("tracker")
        target, restart_after_s = rng.choice(trackers), rng.uniform(0.5, 4)
        if all(s.child is not None for s in trackers):  # one tracker down at a time
            self.cluster.kill(target, restart_after_s=restart_after_s)

    def reset(self, rng: random.Random) -> None:
        self.proxy.reset(rng, rng.choice((1.0, 0.5)))

    def stall(self, rng: random.Random) -> None:
        duration, fraction = rng.uniform(0.2, self.params.max_stall_s), rng.choice((1.0, 0.5))
        if self.stall_thread is None or not self.stall_thread.is_alive():
            self.stall_thread = self.proxy.stall_in_background(rng, duration, fraction)

    def heal(self) -> None:
        """No more faults: wait out the current stall and bring every slot back up."""
        if self.stall_thread is not None:
            self.stall_thread.join(timeout=self.params.max_stall_s + 10)
        self.cluster.restart_due(all_now=True)


@pytest.mark.chaos
@pytest.mark.timeout(PARAMS.timeout_s)
def test_chaos(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    params = PARAMS
    monkeypatch.chdir(ROOT)  # children run `python -m tests.chaos.worker`
    rng = random.Random(params.seed)
    # Not pytest's tmp_path: concurrent pytest runs prune those, and a failure's evidence
    # (ledgers, every process's output, the details file) must survive. Removed after a pass.
    run_dir = Path(tempfile.mkdtemp(prefix=f"kmq-chaos-{params.seed}-"))
    ledger_dir = run_dir / "ledgers"
    ledger_dir.mkdir()
    queues = [f"q{i}" for i in range(params.queues)]
    say = _sayer(capsys)
    with ExitStack() as stack:
        # A SIGTERM to pytest must still kill the children (by PID) and the broker on the way
        # out, as an exception does; Python's default would just end this process.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        stack.callback(signal.signal, signal.SIGTERM, previous)
        say(
            f"\nchaos: seed={params.seed} (KMQ_CHAOS_SEED={params.seed} repeats the schedule) "
            f"messages={params.messages} {params.describe()} logs in {run_dir}"
        )
        started = time.time()
        proxy = FaultProxy()
        # Advertising the proxy's port puts every client connection through the proxy.
        broker = EmbeddedBroker(log_path=run_dir / "tansu.log", advertised_port=proxy.port)
        broker.start()
        stack.callback(broker.stop)
        proxy.start(broker.port)
        stack.callback(proxy.close)
        children = Children()
        stack.callback(_save_output, children, run_dir / "logs")
        stack.callback(children.cleanup)
        bootstrap = proxy.address
        ensure_topics(
            kmq.ServiceConfig(
                bootstrap_servers=bootstrap,
                queue_topic=QUEUE_TOPIC,
                marker_topic=MARKER_TOPIC,
                queue_partitions=PARTITIONS,
                marker_partitions=PARTITIONS,
            )
        )
        tracker_config = TrackerConfig(
            bootstrap_servers=bootstrap,
            queue_topic=QUEUE_TOPIC,
            marker_topic=MARKER_TOPIC,
            group_id="chaos-tracker",
            default_redelivery_timeout_s=params.lease_s,
            session_timeout_ms=params.tracker_session_timeout_ms,
            commit_interval_s=0.2,
            rebalance=params.tracker_rebalance,
        )

        metrics_ports: dict[str, int] = {}  # tracker name: the port its /metrics is on

        def argv(slot: Slot, name: str) -> list[str]:
            if slot.kind == "tracker":
                metrics_ports[name] = free_port()
                return tracker_argv(tracker_config, metrics_ports[name])
            common = [
                "-m", "tests.chaos.worker", slot.kind,
                "--bootstrap-servers", bootstrap,
                "--queue-topic", QUEUE_TOPIC,
                "--marker-topic", MARKER_TOPIC,
                "--queues", ",".join(queues),
                "--name", name,
                "--ledger", str(ledger_dir / f"{name}.jsonl"),
                "--seed", str(params.seed),
                "--clock-skew-s", str(slot.skew_s),
                "--redelivery-timeout-s", str(params.lease_s),
                "--session-timeout-ms", str(params.session_timeout_ms),
            ]  # fmt: skip
            if slot.kind == "worker":
                return [
                    *common,
                    "--max-in-flight", str(params.worker_max_in_flight),
                    "--nack-probability", str(params.nack_probability),
                    "--max-work-ms", str(params.worker_max_work_ms),
                    "--handlers", str(params.worker_handlers),
                ]  # fmt: skip
            share = params.messages // params.producers
            count = share + (params.messages % params.producers if slot.index == 0 else 0)
            return [*common, "--count", str(count), "--rate", str(params.rate)]

        cluster = Cluster(children, argv)
        trackers = [cluster.spawn(s) for s in cluster.add("tracker", params.trackers)]

        def caught_up(name: str) -> Callable[[], bool]:
            return lambda: event_count(metrics_ports[name], "caught_up") >= 1

        for child in trackers:
            wait_until(caught_up(child.name), 60, f"{child.name} to catch up")
        workers = [cluster.spawn(s) for s in cluster.add("worker", params.workers, WORKER_SKEWS_S)]
        for child in workers:
            child.wait_for("ready", 60)

        # -- chaos ------------------------------------------------------------------------
        producer_slots = cluster.add("producer", params.producers, PRODUCER_SKEWS_S)
        producers = [cluster.spawn(s) for s in producer_slots]
        chaos = Chaos(params, rng, cluster, proxy)
        chaos_started = time.monotonic()
        next_progress = chaos_started + 30
        while True:
            now = time.monotonic()
            producing = any(p.proc.poll() is None for p in producers)
            if now - chaos_started >= params.chaos_cap_s:
                say(f"chaos: producers still running after {params.chaos_cap_s:g} s")
                break
            if now - chaos_started >= params.chaos_s and not producing:
                break
            _respawn_crashed(cluster, say)
            next_event = chaos.tick()
            if params.chaos_s > 120 and now >= next_progress:
                next_progress = now + 30
                say(_progress(cluster, proxy, now - chaos_started))
            time.sleep(max(0.0, min(next_event - time.monotonic(), 0.25)))  # the schedule
        chaos.heal()
        chaos_ended = time.time()
        for producer in producers:
            producer.proc.wait(timeout=params.chaos_cap_s)
        cluster.reap()

        # -- drain: every sent message must be settled ---------------------------------
        sent = read_ledgers(ledger_dir, cluster.incarnations).sent
        markers, queue_log = MarkerLog(), QueueLog()
        marker_tail = TopicTail(bootstrap, MARKER_TOPIC)
        stack.callback(marker_tail.close)
        queue_tail = TopicTail(bootstrap, QUEUE_TOPIC)
        stack.callback(queue_tail.close)
        retry_tail = TopicTail(bootstrap, retry_topic_for(QUEUE_TOPIC))
        stack.callback(retry_tail.close)
        tails = (marker_tail, queue_tail, retry_tail)
        _drain(params, sent, tails, (markers, queue_log), cluster, say)
        drained_in = time.time() - chaos_ended

        # -- stop everything, then read the final state ------------------------------------
        for slot in [*cluster.of("tracker"), *cluster.of("worker")]:
            cluster.kill(slot, restart_after_s=None, chaos=False)
        cluster.reap()
        stalled: list[str] = []
        reads = [
            (marker_tail, markers.add),
            (queue_tail, queue_log.add),  # after the markers: see MarkerLog.resolve
            (retry_tail, queue_log.add_copy),
        ]
        for tail, add in reads:
            tail.refresh()  # the last records were written after its last fetch
            try:
                tail.read_to_end(add, timeout_s=120)
            except TailStalled as stall:
                stalled.append(tail.topic)
                say(f"chaos: {stall}; the ledger below counts only what was read")
        markers.resolve(queue_log)
        ledgers = read_ledgers(ledger_dir, cluster.incarnations)
        run = RunLog(
            seed=params.seed,
            lease_s=params.lease_s,
            fault_grace_s=params.fault_grace_s,
            started=started,
            finished=time.time(),
            incarnations=cluster.incarnations,
            faults=list(proxy.faults),
        )
        report = check(run, ledgers, markers, queue_log)
        (run_dir / "run.json").write_text(json.dumps(asdict(run), indent=1), encoding="utf-8")
        # Only for a loss: a read_committed reader of the markers topic takes a while.
        stops = committed_stops(bootstrap, MARKER_TOPIC) if report.lost else {}
        details = _details(report, ledgers, markers, queue_log, cluster, run_dir, stops)
        say(report.summary(params.describe()) + f" drained_in={drained_in:.0f}s")
        for delay, what in sorted(report.slow_redeliveries, reverse=True)[:5]:
            say(f"chaos: slow redelivery {delay:.1f} s beyond the lease: {what}")

    expected = params.messages
    assert not stalled, f"could not read {stalled} to the end: {details}"
    assert report.messages == expected - ledgers.gave_up, details
    assert not report.lost, f"{len(report.lost)} messages lost: {details}"
    assert not report.acked_without_end, f"ack() returned without an END marker: {details}"
    assert not report.early, f"redelivered before the lease ran out: {details}"
    assert not report.unexplained, f"redeliveries without a cause: {details}"
    assert report.causes["tracker_lag"] == 0, (
        f"redelivered before the tracker had read a holder's markers: {details}"
    )
    assert len(report.overload) <= params.overload_tolerance, (
        f"{len(report.overload)} redeliveries while holders were alive and connected: {details}"
    )
    assert not report.crashed, f"processes exited by themselves: {details}"
    assert ledgers.gave_up == 0, f"{ledgers.gave_up} sends failed {SEND_TRIES} times in a row"
    assert markers.undecodable == 0, "undecodable records on the markers topic"
    # The chaos really happened.
    assert report.worker_kills and report.tracker_kills, details
    assert report.resets and report.stalls, details
    assert report.causes["holder_killed"] + report.causes["buffered_killed"] > 0, details
    assert report.causes["nacked"] > 0, details
    assert all(report.skewed_markers) and all(report.skewed_records), (
        f"clock skew not visible in record timestamps: markers ahead/behind "
        f"{report.skewed_markers}, queue records {report.skewed_records}"
    )
    if not os.environ.get("KMQ_CHAOS_KEEP"):
        shutil.rmtree(run_dir)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _respawn_crashed(cluster: Cluster, say: Callable[[str], None]) -> None:
    """Start again any worker or tracker that exited by itself (the ledger reports it)."""
    for inc in cluster.reap():
        if inc.kind != "producer":
            say(f"chaos: {inc.name} exited by itself with code {inc.exit_code}")
            cluster.spawn(next(s for s in cluster.slots if s.incarnation is inc))


def _drain(
    params: Params,
    sent: dict[str, float],
    tails: tuple[TopicTail, TopicTail, TopicTail],
    logs: tuple[MarkerLog, QueueLog],
    cluster: Cluster,
    say: Callable[[str], None],
) -> None:
    """Read the markers until every sent message is settled. A loaded machine may still be
    working off a backlog: give up only once nothing was settled for ``drain_s`` (or at the
    overall cap); whatever is unsettled then is lost."""
    started = time.monotonic()
    cap = started + params.drain_cap_s
    stuck_at = started + params.drain_s
    next_progress = started + 30
    missing = len(sent)
    marker_tail, queue_tail, retry_tail = tails
    markers, queue_log = logs
    while True:
        try:
            marker_tail.read_to_end(markers.add, timeout_s=60)
            queue_tail.read_to_end(queue_log.add, timeout_s=60)  # names what was just read
            retry_tail.read_to_end(queue_log.add_copy, timeout_s=60)
        except TailStalled as stall:
            # Run 56 lost its whole ledger to one such stall of the markers tail. A stall
            # settles nothing, so ``drain_s`` still bounds the wait; the ledger then counts
            # what the tails have read.
            say(f"chaos drain: {stall} (nothing read for 60 s); reading on")
        markers.resolve(queue_log)
        still = len(sent.keys() - markers.settled)
        if still < missing:
            missing, stuck_at = still, time.monotonic() + params.drain_s
        if not missing or time.monotonic() > min(stuck_at, cap):
            return
        if params.chaos_s > 120 and time.monotonic() >= next_progress:
            next_progress = time.monotonic() + 30
            say(f"chaos drain: {time.monotonic() - started:.0f}s unsettled={missing}")
        _respawn_crashed(cluster, say)


def _save_output(children: Children, directory: Path) -> None:
    """Every child's output, one file per incarnation, for the post-mortem."""
    directory.mkdir(exist_ok=True)
    for child in children.all:
        child.events()  # drains the output read so far into child.lines
        text = "\n".join(child.lines) + "\n"
        (directory / f"{child.name}.log").write_text(text, encoding="utf-8")


def _progress(cluster: Cluster, proxy: FaultProxy, elapsed_s: float) -> str:
    kills = sum(1 for i in cluster.incarnations if i.killed is not None)
    return f"chaos: {elapsed_s:.0f}s kills={kills} faults={len(proxy.faults)}"


def _details(
    report: Report,
    ledgers: Ledgers,
    markers: MarkerLog,
    queue_log: QueueLog,
    cluster: Cluster,
    run_dir: Path,
    stops: dict[int, tuple[int, int]],
) -> str:
    """Write what a failure needs to a file in run_dir; return its first lines."""
    lines = [
        f"seed={report.seed}: KMQ_CHAOS_SEED={report.seed} .venv/bin/pytest -s tests/chaos "
        "replays this kill and fault schedule",
        f"lost={len(report.lost)} early={len(report.early)} "
        f"unexplained={len(report.unexplained)} overload={len(report.overload)} "
        f"crashed={report.crashed} acked_without_end={len(report.acked_without_end)} "
        f"unattributed_starts={report.unattributed_starts} copies={report.copies} "
        f"send_failures={report.send_failures} gave_up={report.gave_up}",
        f"every process's output: {run_dir / 'logs'}; kills and faults: {run_dir / 'run.json'}",
    ]
    # A markers partition a transaction the broker never finished holds: nothing after it
    # reached a tracker (README, Stalled partitions; on the embedded broker, run 67).
    for partition, (position, highwater) in sorted(stops.items()):
        lines.append(
            f"markers partition {partition}: read_committed readers stop at offset {position} "
            f"of {highwater} (a transaction the broker has not finished)"
        )
    if stops:
        behind = lost_behind(report.lost, markers.records, stops)
        lines.append(f"lost with a marker past those stops: {len(behind)} of {len(report.lost)}")
    lines += [f"early: {e}" for e in report.early[:200]]
    lines += [f"unexplained: {u}" for u in report.unexplained[:200]]
    lines += [f"overload: {u}" for u in report.overload[:200]]
    for child in cluster.children.all:
        child.events()  # drains the output read so far into child.lines
        if child.proc.returncode not in (None, 0, -signal.SIGKILL):
            lines.append(f"--- {child.name} exit {child.proc.returncode}, last output:")
            lines.extend(child.lines[-15:])
    for message_id in report.lost[:200]:
        lines.append(f"lost {message_id} sent at {ledgers.sent.get(message_id, 0):.3f}")
    wanted = set(report.lost[:200]) | set(report.acked_without_end[:200])
    for record in markers.records:
        if record.message_id in wanted:
            m = record.marker
            lines.append(
                f"  marker {record.message_id} {m.type.name} record={m.partition}:{m.offset} "
                f"attempt={m.attempt} reason={m.reason!r} at={record.partition}:"
                f"{record.offset} ts={record.timestamp_s:.3f}"
            )
    for event in ledgers.events:
        if event.id in wanted:
            lines.append(
                f"  ledger {event.id} {event.kind} by {event.worker} at {event.t:.3f} "
                f"attempt={event.attempt} record={event.delivery}"
            )
    # Where each lost message's records are, and who took the records next to them: a
    # message never started was skipped by whoever read past it.
    lost = set(report.lost[:200])
    places = {d: i for d, i in queue_log.names.items() if i in lost}
    for (lane, partition, offset), message_id in sorted(places.items()):
        lines.append(f"  record {message_id} lane={lane} partition={partition} offset={offset}")
        for event in ledgers.events:
            e_lane, e_partition, e_offset = event.delivery
            if (e_lane, e_partition) == (lane, partition) and abs(e_offset - offset) <= 10:
                lines.append(
                    f"    neighbour {e_offset} {event.kind} by {event.worker} at {event.t:.3f}"
                )
    # Where the slowest redeliveries spent their time: before the tracker redelivered, or
    # between the copy's writing and a worker taking it.
    slowest = sorted(report.slow_redeliveries, reverse=True)
    for delay, what in slowest[:20]:
        lines.append(f"slow redelivery {delay:.1f} s beyond the lease: {what}")
    # Every one, for the percentiles' make-up (which part, which cause, which kill).
    (run_dir / "redelivery-delays.txt").write_text(
        "".join(f"{delay:.2f} {what}\n" for delay, what in slowest), encoding="utf-8"
    )
    for slot in cluster.slots:
        lines.append(f"slot {slot.kind}{slot.index}: {slot.generations} incarnations")
    path = run_dir / "chaos-details.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"details in {path}:\n" + "\n".join(lines[:40])
