"""The chaos suite's ledger check: what was sent, what the workers did, what the broker holds.

Sources, all on real (unskewed) wall-clock seconds except record timestamps:

- the producers' and workers' ledger files (:mod:`tests.chaos.roles`);
- the suite's own record of every process incarnation (start, SIGKILL, exit) and every
  injected network fault;
- the markers topic and the queue topic, read back to their high watermarks. Record
  timestamps there are the writers' clocks: skewed for workers and producers (the suite knows
  each incarnation's skew), real for trackers, which run unskewed.

What :func:`check` establishes:

- **lost**: sent ids (``send()`` returned) without a settling marker (END, or DEAD_LETTERED
  once kmq has it) on the markers topic. Must be empty.
- **acked without END**: ``ack()`` returned but no END marker for that id exists. Must be empty.
- **early**: a redelivery (a REDELIVERED marker, or a DEAD_LETTERED one: a redelivery to the
  dead-letter queue) for an expired lease decided less than one lease after the START of the
  delivery it replaces. The tracker starts a lease when it *reads* a marker, never
  earlier than the marker was written, so ``REDELIVERED time - START write time >= lease``
  holds for every correct redelivery, whatever the load; a tracker that trusted marker
  timestamps would break it for the START of a worker whose clock runs behind. The START's
  write time is taken as the earliest of its timestamp minus the skew of each worker
  incarnation alive at that moment: a lower bound, since its writer is one of them. Must be
  empty.
- **unexplained**: a redelivery with no cause in the ledger. A redelivery is explained if its
  reason is the chaos workers' nack reason and that NACK marker (or the worker's ledger line)
  exists; or its lease expired and one of: a worker that had taken it was SIGKILLed before
  settling it; a SIGKILLed worker wrote a START of it that none of the workers that had
  taken it can have written (buffered, never handed out: whoever took the record after
  it STARTed it again, but that lease was out already); a network fault overlapped the
  last lease before it (``fault.start <= redelivered_at`` and
  ``fault.end >= redelivered_at - lease - grace``). A second REDELIVERED for the same
  delivery needs a tracker kill or a fault since the first
  (``repeat``), or, for a nack's, a worker that took that delivery again after the first and
  nacked it (``renacked``: its first reader's offset commit never landed, so the partition's
  next owner read the record again, an at-least-once duplicate). Must be empty.
- **overload**: a lease-expiry redelivery with none of those causes whose holders were alive
  is blamed on CPU starvation: ``holder_silent`` when the holder wrote nothing of it (START,
  KEEPALIVE, END, NACK) for a whole lease at some point before the redelivery (its lease ran
  out, even if it wrote again later); ``tracker_lag`` when its writes never paused that long,
  so the tracker acted before it had read them (PROBE markers rule that out: it must be 0).
  Both break the README's "never redelivered while its consumer is alive and can reach the
  broker", so they are reported one by one, and tolerated only in small numbers: load is not
  kmq's to control, but a tracker that decides deadlines while it lags behind the markers log is a
  design gap.
- **duplicates**: deliveries (``took`` lines) beyond the first per id: counted, reported.
- **redelivery delay beyond the lease**: for redeliveries caused by a SIGKILL, the time from
  the kill to a worker receiving the new copy, minus the lease: reported (p50, p99, max).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from kmq.errors import MarkerDecodeError
from kmq.markers import Marker, MarkerType, decode_all
from kmq.records import parse_queue_headers
from tests.chaos.proxy import Fault
from tests.chaos.roles import NACK_REASON
from tracker.state import LEASE_EXPIRED_REASON, UNREAD_REASON

SETTLED_TYPES: frozenset[MarkerType] = frozenset(
    t for t in MarkerType if t.name in ("END", "DEAD_LETTERED")
)
"""Marker types after which a message is never delivered again."""
REDELIVERY_TYPES: frozenset[MarkerType] = frozenset(
    t for t in MarkerType if t.name in ("REDELIVERED", "DEAD_LETTERED")
)
"""Marker types a tracker writes when it acts on a delivery: a new copy, or a dead letter."""
WORKER_MARKER_TYPES = frozenset(
    {MarkerType.START, MarkerType.KEEPALIVE, MarkerType.END, MarkerType.NACK}
)
TIMESTAMP_SLACK_S = 0.005
"""Record timestamps are whole milliseconds."""
PLAUSIBLE_SLACK_S = 5.0
"""How far outside an incarnation's lifetime a START's corrected time may fall and still be
attributed to it (process start-up and the write-to-ledger lag)."""
UNREAD_WINDOW_S = 36.0
"""How long before a watched copy is copied again its reader may have been killed: the copy
is looked at every 2 s for 30 s after it was written (tracker defaults), and may have been
written up to a second after its reader last said it reads there, plus slack."""

SLOW_S = 10.0
"""Delays beyond the lease over this long (issue 11's bound on their p99) are counted by where
the time went (``Report.slow_kinds``)."""
READER_WINDOW_S = 5.0
"""A worker that took a record of a queue within this long before a copy's REDELIVERED
marker, and is still alive then, counts as reading that queue; so does one whose last
``reads`` line by then names a retry-lane partition of it (an idle member's spare: it takes
nothing while nothing comes)."""

Delivery = tuple[int, int, int]
"""(lane, partition, offset): lane 0 is the queue topic, 1 the retry topic."""


def where(marker: Marker) -> Delivery:
    """The delivery a marker is about."""
    return (marker.lane, marker.partition, marker.offset)


@dataclass
class Incarnation:
    """One run of one slot's process."""

    name: str
    kind: str
    """``worker``, ``tracker`` or ``producer``."""
    slot: int
    skew_s: float
    started: float
    killed: float | None = None
    """Real time of the suite's SIGKILL during the chaos phase."""
    stopped: float | None = None
    """Real time the suite ended it after the chaos phase, or it exited by itself."""
    exit_code: int | None = None
    """Set when it exited by itself."""

    @property
    def end(self) -> float:
        return self.killed or self.stopped or float("inf")


@dataclass(frozen=True)
class WorkerEvent:
    kind: str
    worker: str
    t: float
    id: str
    queue: str
    attempt: int
    delivery: Delivery


@dataclass(frozen=True)
class MarkerRecord:
    partition: int
    offset: int
    timestamp_s: float
    marker: Marker
    message_id: str
    """Of the record the marker names (markers carry no ids since protocol version 2)."""


@dataclass(frozen=True)
class QueueRecord:
    partition: int
    offset: int
    timestamp_s: float
    id: str
    attempt: int


@dataclass(frozen=True)
class Reads:
    """What one worker's consumer of ``queue`` read from time ``t`` (a ``reads`` line)."""

    worker: str
    t: float
    queue: str
    retry: tuple[int, ...]


@dataclass
class Ledgers:
    sent: dict[str, float] = field(default_factory=dict)
    """Message id -> real time ``send()`` returned."""
    send_failures: int = 0
    gave_up: int = 0
    events: list[WorkerEvent] = field(default_factory=list)
    reads: list[Reads] = field(default_factory=list)


def read_ledgers(directory: Path, incarnations: Iterable[Incarnation]) -> Ledgers:
    ledgers = Ledgers()
    for inc in incarnations:
        path = directory / f"{inc.name}.jsonl"
        if inc.kind == "tracker" or not path.exists():
            continue
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.endswith("\n"):
                    continue  # cut short by a SIGKILL
                event: dict[str, Any] = json.loads(line)
                kind = event["e"]
                if kind == "sent":
                    ledgers.sent[event["id"]] = event["t"]
                elif kind == "send_failed":
                    ledgers.send_failures += 1
                elif kind == "gave_up":
                    ledgers.gave_up += 1
                elif kind == "reads":
                    ledgers.reads.append(
                        Reads(inc.name, event["t"], event["q"], tuple(event["retry"]))
                    )
                else:
                    ledgers.events.append(
                        WorkerEvent(
                            kind,
                            inc.name,
                            event["t"],
                            event["id"],
                            event["q"],
                            event["a"],
                            (event.get("l", 0), event["p"], event["o"]),
                        )
                    )
    return ledgers


class TailStalled(AssertionError):
    """A :class:`TopicTail` read nothing for its whole timeout short of the topic's end."""


class TopicTail:
    """Reads a whole topic from the beginning, without a group, in increments."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        timeout_s: float = 30.0,
        isolation_level: str = "read_uncommitted",
    ) -> None:
        self.topic = topic
        self._bootstrap_servers = bootstrap_servers
        self._isolation_level = isolation_level
        self._consumer = self._new_consumer()
        deadline = time.monotonic() + timeout_s
        while not (partitions := self._consumer.partitions_for_topic(topic)):
            if time.monotonic() > deadline:
                self._consumer.close()
                raise AssertionError(f"topic {topic} has no partitions")
            time.sleep(0.1)
        self._tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._tps)
        self._consumer.seek_to_beginning(*self._tps)

    def _new_consumer(self) -> KafkaConsumer:
        return KafkaConsumer(
            bootstrap_servers=self._bootstrap_servers,
            client_id="kmq-chaos-ledger",
            enable_auto_commit=False,
            isolation_level=self._isolation_level,
            # The embedded broker stops listing a partition's batches when a fetch's wait runs
            # out and then answers with nothing (tracker.reread.FETCH_WAIT_MS): at 100 ms that
            # is the likeliest reason run 56's markers tail read nothing for 60 s.
            fetch_max_wait_ms=1000,
        )

    def refresh(self) -> None:
        """Forget the high watermarks seen so far (keeping the positions), so the next
        :meth:`read_to_end` reads up to watermarks fetched after this call. Without it, a
        watermark from a fetch answered before the last writes could end the read early."""
        positions = {tp: self._consumer.position(tp) for tp in self._tps}
        self._consumer.close()
        self._consumer = self._new_consumer()
        self._consumer.assign(self._tps)
        for tp, offset in positions.items():
            self._consumer.seek(tp, offset)

    def read_to_end(
        self, on_record: Callable[[Any], None], timeout_s: float, cap_s: float | None = None
    ) -> None:
        """Feed every record up to the high watermarks seen while reading to ``on_record``.

        Raises :class:`TailStalled` if ``timeout_s`` passes without a record while the end
        is not reached (a long topic may take longer than that in all), or after ``cap_s``
        (``20 * timeout_s`` by default) in any case. What was read until then has been fed.
        """
        now = time.monotonic()
        stalled_at = now + timeout_s
        cap = now + (20 * timeout_s if cap_s is None else cap_s)
        done: set[TopicPartition] = set()
        while len(done) < len(self._tps):
            if time.monotonic() > min(stalled_at, cap):
                raise TailStalled(f"could not read {self.topic} to its end")
            for batch in self._consumer.poll(timeout_ms=200, max_records=50_000).values():
                stalled_at = time.monotonic() + timeout_s
                for record in batch:
                    on_record(record)
            for tp in self._tps:
                highwater = self._consumer.highwater(tp)
                if highwater is not None and self._consumer.position(tp) >= highwater:
                    done.add(tp)

    def short_of_end(self) -> dict[int, tuple[int, int]]:
        """The partitions not read to their end: (position, high watermark) each."""
        short: dict[int, tuple[int, int]] = {}
        for tp in self._tps:
            highwater, position = self._consumer.highwater(tp), self._consumer.position(tp)
            if highwater is not None and position < highwater:
                short[tp.partition] = (position, highwater)
        return short

    def close(self) -> None:
        self._consumer.close()


def committed_stops(
    bootstrap_servers: str, topic: str, quiet_s: float = 3.0, cap_s: float = 180.0
) -> dict[int, tuple[int, int]]:
    """Where a read_committed reader of ``topic`` stops, by partition: (position, high
    watermark), for the partitions it cannot read to their end, after ``quiet_s`` without a
    record (or ``cap_s`` in all): a transaction the broker has not finished holds those
    (chaos run 67)."""
    tail = TopicTail(bootstrap_servers, topic, isolation_level="read_committed")
    try:
        tail.read_to_end(lambda record: None, timeout_s=quiet_s, cap_s=cap_s)
        return {}
    except TailStalled:
        return tail.short_of_end()
    finally:
        tail.close()


def lost_behind(
    lost: Iterable[str], records: Iterable[MarkerRecord], stops: dict[int, tuple[int, int]]
) -> set[str]:
    """Those of ``lost`` with a marker at or past where read_committed readers of its markers
    partition stop (:func:`committed_stops`): no tracker could read it."""
    wanted = set(lost)
    return {
        r.message_id
        for r in records
        if r.message_id in wanted and r.partition in stops and r.offset >= stops[r.partition][0]
    }


class QueueLog:
    def __init__(self) -> None:
        self.records: list[QueueRecord] = []
        self.names: dict[Delivery, str] = {}
        """Message id by record, for naming markers."""

    def add(self, record: Any, lane: int = 0) -> None:
        message_id, attempt, _ = parse_queue_headers(record.headers)
        if message_id is not None:
            self.names[(lane, record.partition, record.offset)] = message_id
            self.records.append(
                QueueRecord(
                    record.partition, record.offset, record.timestamp / 1000, message_id, attempt
                )
            )

    def add_copy(self, record: Any) -> None:
        """A record of the retry topic."""
        self.add(record, 1)


class MarkerLog:
    """Every marker read so far, named after its record, and the ids that are settled.

    A marker names its record by position only: :meth:`resolve` looks the ids up in a
    :class:`QueueLog` read *after* the markers (a marker is written after its record, so
    every record a marker read so far names is then known).
    """

    def __init__(self) -> None:
        self.records: list[MarkerRecord] = []
        self.settled: set[str] = set()
        self.undecodable = 0
        self._unnamed: list[tuple[int, int, float, Marker]] = []

    def add(self, record: Any) -> None:
        try:
            markers = decode_all(record.value)  # one or more markers
        except MarkerDecodeError:
            self.undecodable += 1
            return
        for marker in markers:
            if marker.type is not MarkerType.PROBE:  # a tracker's own; it names no record
                self._unnamed.append(
                    (record.partition, record.offset, record.timestamp / 1000, marker)
                )

    def resolve(self, queue: QueueLog) -> None:
        still: list[tuple[int, int, float, Marker]] = []
        for partition, offset, ts, marker in self._unnamed:
            message_id = marker.message_id or queue.names.get(where(marker))
            if message_id is None:
                still.append((partition, offset, ts, marker))
                continue
            self.records.append(MarkerRecord(partition, offset, ts, marker, message_id))
            if marker.type in SETTLED_TYPES:
                self.settled.add(message_id)
        self._unnamed = still

    @property
    def unnamed(self) -> int:
        return len(self._unnamed)


@dataclass
class Report:
    seed: int
    messages: int = 0
    lost: list[str] = field(default_factory=list)
    acked_without_end: list[str] = field(default_factory=list)
    deliveries: int = 0
    duplicates: int = 0
    processed_twice: int = 0
    nacks: int = 0
    redeliveries: int = 0
    dead_lettered: int = 0
    copies: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    unexplained: list[str] = field(default_factory=list)
    overload: list[str] = field(default_factory=list)
    """Redeliveries blamed on a starved tracker or holder (``tracker_lag``, ``holder_silent``)."""
    early: list[str] = field(default_factory=list)
    unattributed_starts: int = 0
    delays_beyond_lease_s: list[float] = field(default_factory=list)
    slow_redeliveries: list[tuple[float, str]] = field(default_factory=list)
    """(delay beyond the lease, where the time went) for each delay counted above."""
    tracker_delays_s: list[float] = field(default_factory=list)
    """Each delay's tracker part: from the lease's end to the copy's REDELIVERED marker."""
    consumer_delays_s: list[float] = field(default_factory=list)
    """Each delay's consumer part: from that marker to a worker taking the copy."""
    slow_kinds: Counter[str] = field(default_factory=Counter)
    """Delays over ``SLOW_S`` by where the time went: ``tracker_killed`` / ``tracker_slow``
    (mostly before the REDELIVERED marker, with / without a tracker kill since the holder's),
    ``no_reader`` / ``reader_slow`` (mostly after it, with no worker left reading the queue
    when it was written / with one: see ``READER_WINDOW_S``)."""
    worker_kills: int = 0
    tracker_kills: int = 0
    resets: int = 0
    stalls: int = 0
    crashed: list[str] = field(default_factory=list)
    send_failures: int = 0
    gave_up: int = 0
    skewed_markers: tuple[int, int] = (0, 0)
    """Worker STARTs and ENDs stamped over a minute ahead of / behind when they were written."""
    skewed_records: tuple[int, int] = (0, 0)
    """First-attempt queue records stamped over a minute ahead of / behind when written."""
    elapsed_s: float = 0.0

    def delay_percentile(self, q: float, delays_s: list[float] | None = None) -> float | None:
        delays = sorted(self.delays_beyond_lease_s if delays_s is None else delays_s)
        if not delays:
            return None
        if len(delays) == 1:
            return delays[0]
        return statistics.quantiles(delays, n=100, method="inclusive")[round(q * 100) - 1]

    def summary(self, params: str) -> str:
        def seconds(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.2f}s"

        causes = " ".join(f"{k}={v}" for k, v in sorted(self.causes.items()))
        slow = " ".join(f"{k}={v}" for k, v in sorted(self.slow_kinds.items()))
        return (
            f"chaos summary: seed={self.seed} {params} messages={self.messages} "
            f"kills={self.worker_kills + self.tracker_kills} (workers={self.worker_kills} "
            f"trackers={self.tracker_kills}) faults={self.resets + self.stalls} "
            f"(resets={self.resets} stalls={self.stalls}) nacks={self.nacks} "
            f"lost={len(self.lost)} duplicates={self.duplicates} "
            f"deliveries={self.deliveries} redeliveries={self.redeliveries} "
            f"dead_lettered={self.dead_lettered} ({causes}) "
            f"early={len(self.early)} crashed={len(self.crashed)} "
            f"redelivery_delay_beyond_lease p50={seconds(self.delay_percentile(0.5))} "
            f"p99={seconds(self.delay_percentile(0.99))} "
            f"max={seconds(max(self.delays_beyond_lease_s, default=None))} "
            f"(tracker part p50={seconds(self.delay_percentile(0.5, self.tracker_delays_s))} "
            f"p99={seconds(self.delay_percentile(0.99, self.tracker_delays_s))}, consumer part "
            f"p50={seconds(self.delay_percentile(0.5, self.consumer_delays_s))} "
            f"p99={seconds(self.delay_percentile(0.99, self.consumer_delays_s))}) "
            f"over_{SLOW_S:g}s={sum(self.slow_kinds.values())} ({slow}) "
            f"skewed ahead/behind: markers={self.skewed_markers[0]}/{self.skewed_markers[1]} "
            f"records={self.skewed_records[0]}/{self.skewed_records[1]} "
            f"elapsed={self.elapsed_s:.0f}s"
        )


@dataclass(frozen=True)
class RunLog:
    """What the suite itself recorded."""

    seed: int
    lease_s: float
    fault_grace_s: float
    started: float
    finished: float
    incarnations: list[Incarnation]
    faults: list[Fault]


def check(run: RunLog, ledgers: Ledgers, markers: MarkerLog, queue: QueueLog) -> Report:
    """Everything the chaos test asserts on, from the suite's record, the ledgers and both
    topics read back to their ends (see the module docstring)."""
    report = Report(seed=run.seed, messages=len(ledgers.sent))
    report.elapsed_s = run.finished - run.started
    report.send_failures, report.gave_up = ledgers.send_failures, ledgers.gave_up
    workers = {i.name: i for i in run.incarnations if i.kind == "worker"}
    report.worker_kills = sum(1 for i in workers.values() if i.killed is not None)
    report.tracker_kills = sum(
        1 for i in run.incarnations if i.kind == "tracker" and i.killed is not None
    )
    report.crashed = [f"{i.name} exit={i.exit_code}" for i in run.incarnations if _crashed(i)]
    report.resets = sum(1 for f in run.faults if f.kind == "reset")
    report.stalls = sum(1 for f in run.faults if f.kind == "stall")
    _check_settlement(report, ledgers, markers)
    _check_skew(report, ledgers, markers, queue)
    _check_redeliveries(report, run, ledgers, markers, queue)
    return report


def _check_settlement(report: Report, ledgers: Ledgers, markers: MarkerLog) -> None:
    """Lost messages, acks without END, duplicate deliveries."""
    report.lost = sorted(set(ledgers.sent) - markers.settled)
    ends = Counter(r.message_id for r in markers.records if r.marker.type is MarkerType.END)
    acked = {e.id for e in ledgers.events if e.kind == "acked"}
    report.acked_without_end = sorted(acked - set(ends))
    report.processed_twice = sum(1 for n in ends.values() if n > 1)
    took = [e for e in ledgers.events if e.kind == "took"]
    report.deliveries = len(took)
    report.duplicates = len(took) - len({e.id for e in took})
    report.nacks = sum(1 for e in ledgers.events if e.kind == "nacked")


SKEW_MARGIN_S = 60.0
"""A record counts as skewed when its stamp lies this far outside when it can have been written."""
SEND_WINDOW_S = 60.0
"""How long before ``send()`` returned its record may have been written (retries, stalls)."""


def _check_skew(report: Report, ledgers: Ledgers, markers: MarkerLog, queue: QueueLog) -> None:
    """How many records carry a stamp over a minute outside the real time they were written:
    the skew is real. Each record's write time is bounded by the ledgers (a record exists
    before ``send()`` returns; a START before its delivery is taken; an END after the take
    and before ``ack()`` returns), so the count holds for a run of any length."""
    took: defaultdict[tuple[str, Delivery], list[float]] = defaultdict(list)
    acked: defaultdict[tuple[str, Delivery], list[float]] = defaultdict(list)
    for e in ledgers.events:
        if e.kind == "took":
            took[e.id, e.delivery].append(e.t)
        elif e.kind == "acked":
            acked[e.id, e.delivery].append(e.t)
    ahead = behind = 0
    for r in markers.records:
        key = (r.message_id, where(r.marker))
        if r.marker.type is MarkerType.START:
            sent = ledgers.sent.get(r.message_id)
            lo = None if sent is None else sent - SEND_WINDOW_S
            hi = max(took[key]) if key in took else None
        elif r.marker.type is MarkerType.END and key in took and key in acked:
            lo, hi = min(took[key]), max(acked[key])
        else:
            continue
        ahead += hi is not None and r.timestamp_s > hi + SKEW_MARGIN_S
        behind += lo is not None and r.timestamp_s < lo - SKEW_MARGIN_S
    report.skewed_markers = (ahead, behind)
    ahead = behind = 0
    for q in queue.records:
        sent = ledgers.sent.get(q.id)
        if q.attempt == 1 and sent is not None:
            ahead += q.timestamp_s > sent + SKEW_MARGIN_S
            behind += q.timestamp_s < sent - SEND_WINDOW_S - SKEW_MARGIN_S
    report.skewed_records = (ahead, behind)


def _check_redeliveries(
    report: Report, run: RunLog, ledgers: Ledgers, markers: MarkerLog, queue: QueueLog
) -> None:
    """Was each redelivery (or dead letter) on time, and what caused it?"""
    workers = {i.name: i for i in run.incarnations if i.kind == "worker"}
    by_delivery: dict[tuple[str, Delivery], list[WorkerEvent]] = defaultdict(list)
    receipts: dict[tuple[str, int], list[float]] = defaultdict(list)
    takes_of_queue: dict[str, list[tuple[float, str]]] = defaultdict(list)
    queue_of: dict[str, str] = {}
    for event in ledgers.events:
        by_delivery[(event.id, event.delivery)].append(event)
        if event.kind == "took":
            receipts[(event.id, event.attempt)].append(event.t)
            takes_of_queue[event.queue].append((event.t, event.worker))
            queue_of[event.id] = event.queue
    starts: dict[tuple[str, Delivery], list[MarkerRecord]] = defaultdict(list)
    marks: dict[tuple[str, Delivery], list[MarkerRecord]] = defaultdict(list)
    nacked: set[tuple[str, Delivery]] = set()
    redelivered: list[MarkerRecord] = []
    for record in markers.records:
        key = (record.message_id, where(record.marker))
        if record.marker.type in WORKER_MARKER_TYPES:
            marks[key].append(record)
        if record.marker.type is MarkerType.START:
            starts[key].append(record)
        elif record.marker.type is MarkerType.NACK and record.marker.reason == NACK_REASON:
            nacked.add(key)
        elif record.marker.type in REDELIVERY_TYPES:
            redelivered.append(record)
    report.redeliveries = sum(1 for r in redelivered if r.marker.type is MarkerType.REDELIVERED)
    report.dead_lettered = len(redelivered) - report.redeliveries
    report.copies = sum(1 for r in queue.records if r.attempt > 1)
    tracker_kills = sorted(
        i.killed for i in run.incarnations if i.kind == "tracker" and i.killed is not None
    )
    last_redelivery: dict[tuple[str, Delivery], MarkerRecord] = {}
    checker = _Explainer(run, workers)
    for record in sorted(redelivered, key=lambda r: r.timestamp_s):
        marker = record.marker
        key = (record.message_id, where(marker))
        at = record.timestamp_s
        events = by_delivery.get(key, [])
        key_starts, key_marks = starts.get(key, []), marks.get(key, [])
        sent_at = ledgers.sent.get(record.message_id)
        if key in last_redelivery:
            before = last_redelivery[key]
            last_redelivery[key] = record
            previous = before.timestamp_s
            if any(previous - 1 <= k <= at for k in tracker_kills) or checker.fault_between(
                previous, at
            ):
                report.causes["repeat"] += 1
                continue
            if marker.reason == NACK_REASON and _renacked(events, previous, at):
                # The record was read again after the first redelivery (its first reader's
                # offset commit never landed, so the partition's next owner re-read it: an
                # at-least-once duplicate), and that duplicate delivery was nacked.
                report.causes["renacked"] += 1
                continue
            restarted = _after(key_starts, before, record)
            if not restarted or marker.reason != LEASE_EXPIRED_REASON:
                report.causes["unexplained"] += 1
                report.unexplained.append(
                    f"{record.message_id} {where(marker)}: redelivered again at {at:.3f} "
                    f"(first at {previous:.3f}) with no tracker kill or fault in between; "
                    f"STARTs at {[(s.partition, s.offset) for s in key_starts]}, "
                    f"ledger: {[(e.kind, e.worker, round(e.t, 3)) for e in events]}"
                )
                continue
            # A START after the previous REDELIVERED in the markers log, so read after the
            # tracker had forgotten the delivery: the record was read again (its earlier
            # reader's offset commit never landed), a new lease began, and it ran out too.
            # That lease is explained from what happened after the previous redelivery.
            events = [e for e in events if e.t >= previous]
            key_starts, key_marks = restarted, _after(key_marks, before, record)
            sent_at = previous
        else:
            last_redelivery[key] = record
        if marker.reason == NACK_REASON:
            # The ledger line may be missing: a SIGKILL right after the NACK went out.
            if key in nacked or any(e.kind in ("nacked", "nack_failed") for e in events):
                report.causes["nacked"] += 1
            else:
                report.causes["unexplained"] += 1
                report.unexplained.append(f"{record.message_id} {where(marker)}: nack unknown")
            continue
        if marker.reason.startswith("released"):
            # Only Consumer.close() releases, and chaos workers never close their consumers.
            report.causes["unexplained"] += 1
            report.unexplained.append(
                f"{record.message_id} {where(marker)}: released ({marker.reason})"
            )
            continue
        if marker.reason == UNREAD_REASON:
            # A copy nobody took, copied again toward a live reader (the tracker's
            # unread_copy_s): the consumer reading its retry partition fell silent after it
            # was written. A worker kill or a network fault shortly before explains that.
            since = at - UNREAD_WINDOW_S
            if any(w.killed is not None and since <= w.killed <= at for w in workers.values()):
                report.causes["unread_reader_killed"] += 1
            elif checker.fault_between(since, at):
                report.causes["unread_fault"] += 1
            else:
                report.causes["unread_silent"] += 1
                report.overload.append(
                    f"unread_silent: {record.message_id} {where(marker)}: copied again at "
                    f"{at:.3f}, no worker kill or fault in the {UNREAD_WINDOW_S:g} s before"
                )
            continue
        # The lease expired: was it early, and why did it expire? Holders are the workers that
        # had taken it by then (one that re-read the record later took a duplicate START).
        holders = [
            workers[e.worker]
            for e in events
            if e.kind == "took" and e.worker in workers and e.t <= at
        ]
        start_at = checker.start_written(key_starts, at)
        if start_at is None:
            report.unattributed_starts += 1
        elif at - start_at < run.lease_s - TIMESTAMP_SLACK_S:
            report.early.append(
                f"{record.message_id} {where(marker)}: redelivered {at - start_at:.3f} s "
                f"after its START was written (lease {run.lease_s} s)"
            )
        cause, killed_at = checker.cause(events, holders, key_marks, at, sent_at)
        report.causes[cause] += 1
        if cause in ("unexplained", "tracker_lag", "holder_silent"):
            (report.unexplained if cause == "unexplained" else report.overload).append(
                f"{cause}: {record.message_id} {where(marker)}: lease expired at {at:.3f}, "
                f"holders {[h.name for h in holders]} alive, no fault overlapped the lease; "
                f"ledger: {[(e.kind, e.worker, round(e.t, 3)) for e in events]}"
            )
        elif killed_at is not None:
            after = [t for t in receipts.get((record.message_id, marker.attempt), []) if t >= at]
            if after:
                delay = min(after) - killed_at - run.lease_s
                report.delays_beyond_lease_s.append(delay)
                report.tracker_delays_s.append(at - killed_at - run.lease_s)
                report.consumer_delays_s.append(min(after) - at)
                kind = ""
                if delay > SLOW_S:
                    kind = _slow_kind(
                        killed_at + run.lease_s,
                        at,
                        min(after),
                        tracker_kills,
                        _readers(takes_of_queue[queue_of[record.message_id]], workers, at)
                        | _retry_readers(ledgers.reads, queue_of[record.message_id], workers, at),
                        killed_at,
                    )
                    report.slow_kinds[kind] += 1
                    kind = f" ({kind})"
                report.slow_redeliveries.append(
                    (
                        delay,
                        f"{record.message_id} {where(marker)} cause={cause}{kind}: "
                        f"holder killed at {killed_at:.3f}, redelivered "
                        f"{at - killed_at - run.lease_s:.1f} s beyond the lease (marker "
                        f"{record.partition}:{record.offset}), copy attempt {marker.attempt} "
                        f"taken {min(after) - at:.1f} s after that",
                    )
                )


def _slow_kind(
    lease_end: float,
    redelivered: float,
    taken: float,
    tracker_kills: list[float],
    readers: set[str],
    holder_killed: float,
) -> str:
    """Where a long delay went: see ``Report.slow_kinds``."""
    if redelivered - lease_end >= taken - redelivered:
        if any(holder_killed <= k <= redelivered for k in tracker_kills):
            return "tracker_killed"
        return "tracker_slow"
    return "reader_slow" if readers else "no_reader"


def _readers(
    takes: list[tuple[float, str]], workers: dict[str, Incarnation], at: float
) -> set[str]:
    """The workers alive at ``at`` that took one of ``takes`` within ``READER_WINDOW_S``."""
    return {
        name
        for t, name in takes
        if at - READER_WINDOW_S <= t <= at and name in workers and workers[name].end > at
    }


def _retry_readers(
    reads: list[Reads], queue: str, workers: dict[str, Incarnation], at: float
) -> set[str]:
    """The workers alive at ``at`` whose consumer of ``queue`` last said, by then, that it
    read some retry-lane partition (an idle member's spare, say)."""
    last: dict[str, Reads] = {}
    for r in reads:
        if r.queue == queue and r.t <= at and (r.worker not in last or r.t >= last[r.worker].t):
            last[r.worker] = r
    return {
        name
        for name, r in last.items()
        if r.retry and name in workers and workers[name].end > at
    }


def _after(
    records: list[MarkerRecord], first: MarkerRecord, last: MarkerRecord
) -> list[MarkerRecord]:
    """``records`` that lie between ``first`` and ``last`` in their markers partition: read
    by its tracker after ``first`` and before ``last`` were written."""
    return [
        r
        for r in records
        if r.partition == first.partition and first.offset < r.offset < last.offset
    ]


def _renacked(events: list[WorkerEvent], previous: float, at: float) -> bool:
    """A worker took the delivery again after its first redelivery and nacked it."""
    took = [e.t for e in events if e.kind == "took" and previous <= e.t <= at]
    return bool(took) and any(
        e.kind in ("nacked", "nack_failed") and min(took) <= e.t <= at for e in events
    )


def _crashed(inc: Incarnation) -> bool:
    if inc.exit_code is None:
        return False
    return inc.kind != "producer" or inc.exit_code != 0


class _Explainer:
    def __init__(self, run: RunLog, workers: dict[str, Incarnation]) -> None:
        self._run = run
        self._workers = list(workers.values())

    def fault_between(self, start: float, end: float) -> bool:
        grace = self._run.lease_s + self._run.fault_grace_s
        return any(f.start <= end and f.end >= start - grace for f in self._run.faults)

    def start_written(self, starts: list[MarkerRecord], redelivered_at: float) -> float | None:
        """The earliest real time one of ``starts`` can have been written: its timestamp minus
        the skew of a worker alive then, before the redelivery. Its true writer is among those
        workers, so this is never later than the truth: a lower bound, as the check needs.
        Skews at least 150 s apart keep the other workers from making it much earlier."""
        times = [
            start.timestamp_s - inc.skew_s
            for start in starts
            for inc in self._workers
            if _alive_at(inc, start.timestamp_s - inc.skew_s)
            and start.timestamp_s - inc.skew_s <= redelivered_at + PLAUSIBLE_SLACK_S
        ]
        return min(times, default=None)

    def cause(
        self,
        events: list[WorkerEvent],
        holders: list[Incarnation],
        marks: list[MarkerRecord],
        at: float,
        sent_at: float | None = None,
    ) -> tuple[str, float | None]:
        """Why a lease expired, and the kill behind it if a kill was the cause."""
        settled = {e.worker for e in events if e.kind in ("acked", "nacked")}
        for holder in holders:
            if holder.killed is not None and holder.killed <= at and holder.name not in settled:
                return "holder_killed", holder.killed
        # A killed worker that wrote a START and died before handing the message out left a
        # lease that runs out whoever takes the record next: the partition's next owner reads
        # it again and STARTs it too, and a tracker already redelivering the first lease
        # when it reads that START sends the copy all the same (in full chaos run 40, with
        # 2 to 6 s redelivery rounds, a live holder's ack came 0.5 s before the copy).
        earliest = -math.inf if sent_at is None else sent_at - PLAUSIBLE_SLACK_S
        kills = [
            inc.killed
            for inc in self._workers
            if inc.killed is not None
            and inc.killed <= at
            and any(
                self._could_write(inc, m, earliest, at)
                and not any(self._could_write(h, m, earliest, at) for h in holders)
                for m in marks
                if m.marker.type is MarkerType.START
            )
        ]
        if kills:
            return "buffered_killed", max(kills)
        if self.fault_between(at, at):
            return "fault", None
        return self._load(events, holders, marks, at), None

    @staticmethod
    def _could_write(inc: Incarnation, start: MarkerRecord, earliest: float, at: float) -> bool:
        """Whether ``inc`` may have written ``start``: alive when its stamp, less its skew,
        says it was written, and not before the message was sent (a START's stamp read with
        another worker's skew points 150 s or more away, at some other incarnation)."""
        written = start.timestamp_s - inc.skew_s
        return _alive_at(inc, written) and earliest <= written <= at + PLAUSIBLE_SLACK_S

    def _load(
        self,
        events: list[WorkerEvent],
        holders: list[Incarnation],
        marks: list[MarkerRecord],
        at: float,
    ) -> str:
        """Blame a redelivery with no kill, nack or fault behind it on the tracker (it had not
        read a marker written less than a lease before) or on the holder (it wrote nothing for
        a lease): what a starved process does on an overloaded machine."""
        candidates = holders or self._workers
        names = {h.name for h in candidates}
        writes = [e.t for e in events if e.worker in names and e.kind in _SETTLING and e.t <= at]
        writes += [
            m.timestamp_s - inc.skew_s
            for m in marks
            for inc in candidates
            if _alive_at(inc, m.timestamp_s - inc.skew_s) and m.timestamp_s - inc.skew_s <= at
        ]
        if not writes:
            return "unexplained"
        # A holder that went quiet for a lease (between two of its writes, or since its last
        # one) let its lease run out, even if it wrote again before the redelivery: holder
        # side. Regular writes and a redelivery all the same: the tracker decided before it
        # had read them.
        points = [*sorted(writes), at]
        lease = self._run.lease_s - TIMESTAMP_SLACK_S
        if any(b - a >= lease for a, b in itertools.pairwise(points)):
            return "holder_silent"
        return "tracker_lag"


_SETTLING = frozenset({"acked", "nacked", "ack_failed", "nack_failed"})


def _alive_at(inc: Incarnation, t: float) -> bool:
    return inc.started - PLAUSIBLE_SLACK_S <= t <= inc.end + PLAUSIBLE_SLACK_S
