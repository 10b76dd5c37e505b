"""``kmq status``: reading one status report from the cluster (:mod:`kmq.status` holds the
pure part).

Every partition end is a high watermark from fetch responses (``end_offsets()`` is wrong on
some brokers). Counts are exact where the records were read (a queue's partitions may hold
other queues' records, told apart by key); a read cut short by ``scan_limit_records`` or the
timeout counts what it did not reach whole, and the queue's counts are then upper bounds.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import KafkaError
from kafka.protocol.admin import DescribeGroupsRequest

from kmq import kafka_clients
from kmq.config import ServiceConfig
from kmq.control import ControlTable, read_control
from kmq.errors import BrokerError, KmqError
from kmq.kafka_clients import KafkaConnection
from kmq.layout import read_partitions, write_partitions
from kmq.markers import QUEUE_LANE, RETRY_LANE
from kmq.policy import RetryPolicy
from kmq.status import (
    Delivery,
    OpenDeliveries,
    QueueStatus,
    Status,
    TrackerGroup,
    TrackerMember,
    assigned_partitions,
    count_in_range,
    in_flight_of,
)
from kmq.topics import high_watermarks
from kmq.validation import check_queue_id

SCAN_LIMIT_RECORDS = 200_000
"""Records one report reads at most (markers, records of open deliveries, backlogs)."""
_GAP = 5000
"""Offsets of open deliveries further apart than this are read by separate seeks."""

Visit = Callable[[TopicPartition, Any], None]


class _GroupAdmin(KafkaAdminClient):  # type: ignore[misc]
    """DescribeGroups at version 2 at most: versions 3 and up carry the group's authorized
    operations, which kafka-python 3.0.12 fails to parse when a broker sets bits it does not
    know (the embedded Tansu sets them all). Version 2 has every field a status needs."""

    def _describe_groups_request(self, group_ids: Sequence[str]) -> Any:
        return DescribeGroupsRequest(groups=list(group_ids), max_version=2)


@dataclass(frozen=True)
class _Count:
    """Records keyed ``key`` in ``[start, end)`` of ``tp``; ``start`` ``None``: the log start."""

    tp: TopicPartition
    key: bytes
    start: int | None
    end: int


def read_status(
    config: ServiceConfig,
    queues: Sequence[str] = (),
    *,
    tracker_group: str = "kmq-tracker",
    scan_limit_records: int = SCAN_LIMIT_RECORDS,
    timeout_s: float = 30.0,
) -> Status:
    """A status report of ``queues`` (default: every queue that has a consumer group or an
    open delivery) on ``config``'s topics."""
    for queue in queues:
        check_queue_id(queue)
    conn = config.connection
    admin = _admin(conn)
    try:
        reader = kafka_clients.consumer(
            conn,
            "status",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            fetch_max_wait_ms=50,
        )
        try:
            report = _Report(config, admin, reader, tracker_group, scan_limit_records, timeout_s)
            return report.read(queues)
        finally:
            reader.close()
    except KafkaError as exc:
        raise BrokerError(f"reading the status failed: {exc!r}") from exc
    finally:
        admin.close()


def _admin(conn: KafkaConnection) -> _GroupAdmin:
    try:
        return _GroupAdmin(**kafka_clients.client_args(conn, "status-admin", {}))
    except KafkaError:
        raise BrokerError(
            f"cannot connect to Kafka at {conn.bootstrap_servers}: {kafka_clients.diagnose(conn)}"
        ) from None


class _Report:
    def __init__(
        self,
        config: ServiceConfig,
        admin: _GroupAdmin,
        reader: Any,
        tracker_group: str,
        scan_limit_records: int,
        timeout_s: float,
    ) -> None:
        self.config = config
        self.tracker_group = tracker_group
        self.admin = admin
        self.reader = reader
        self.budget = scan_limit_records
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.notes: list[str] = []

    def read(self, asked: Sequence[str]) -> Status:
        cfg = self.config
        now_ms = int(time.time() * 1000)
        counts = self._partition_counts()
        control = read_control(cfg.connection, cfg.control_topic, self.timeout_s)
        tracker = self._tracker()
        tps = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
        ends = high_watermarks(cfg.connection, tps, self._remaining_s())
        opened = self._replay_markers(tracker, ends)
        queue_of, unread = self._queues_of(opened)
        names = list(dict.fromkeys(asked)) or self._discover(queue_of.values(), opened)
        dead = {q: RetryPolicy().dead_letter_queue_for(q) for q in names}
        groups = [g for q in {*names, *dead.values()} for g in self._groups(q)]
        committed = self._committed(groups)
        plans = {
            q: self._plan(q, control, counts, ends, committed) for q in {*names, *dead.values()}
        }
        matched, reached = self._count(plans)

        def total(counts: list[_Count]) -> tuple[int, bool]:
            return _total(counts, matched, reached)

        rows = []
        for queue in names:
            backlog, exact_b = total(plans[queue]["backlog"])
            redelivered, exact_r = total(plans[queue]["redelivered"])
            letters, exact_d = total(plans[dead[queue]]["backlog"])
            in_flight, oldest_s = in_flight_of(opened.open(), queue_of, queue, now_ms)
            read_before = any(committed.get(g) for g in self._groups(queue))
            known = backlog or redelivered or in_flight or read_before
            if asked and not known and exact_b and exact_r:
                raise KmqError(
                    f"unknown queue {queue!r} on {cfg.queue_topic}: no consumer group has "
                    "read it and none of its records is there"
                )
            placed = write_partitions(
                control.layout(cfg.queue_topic), queue, counts[cfg.queue_topic]
            )
            row = QueueStatus(
                queue=queue,
                partitions=placed,
                backlog_records=backlog,
                in_flight=in_flight,
                oldest_in_flight_age_s=oldest_s,
                redeliveries=redelivered,
                dead_letters=letters,
                dead_letter_queue=dead[queue],
                paused_until_ms=control.pauses.paused_until_ms(queue, now_ms),
                exact=exact_b and exact_r and exact_d,
            )
            rows.append(row)
        return Status(
            taken_at_ms=now_ms,
            queue_topic=cfg.queue_topic,
            queues=tuple(rows),
            tracker=tracker,
            unattributed_in_flight=unread,
            notes=tuple(dict.fromkeys(self.notes)),
        )

    # -- topics and groups ----------------------------------------------------------------

    def _remaining_s(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def _partition_counts(self) -> dict[str, int]:
        cfg = self.config
        known = self.reader.topics()  # one metadata request for every topic
        counts: dict[str, int] = {}
        for topic in (cfg.queue_topic, cfg.retry_topic, cfg.marker_topic):
            if topic not in known:
                if topic == cfg.retry_topic:
                    counts[topic] = 0  # made by kmq 0.1: no retry lane
                    continue
                raise KmqError(f"topic {topic} does not exist (wrong topic option?)")
            counts[topic] = len(self.reader.partitions_for_topic(topic) or ())
        return counts

    def _groups(self, queue: str) -> tuple[str, str]:
        """The consumer groups of ``queue``: the queue topic's and the retry topic's."""
        group = f"kmq.{self.config.queue_topic}.{queue}"
        return group, f"{group}.retry"

    def _committed(self, groups: Sequence[str]) -> dict[str, dict[TopicPartition, int]]:
        found = self.admin.list_group_offsets({g: None for g in groups}) if groups else {}
        return {
            group: {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
            for group, offsets in found.items()
        }

    def _tracker(self) -> TrackerGroup:
        group = self.tracker_group
        described = self.admin.describe_groups([group]).get(group, {})
        topic = self.config.marker_topic
        members = tuple(
            TrackerMember(
                member_id=str(m.get("member_id", "")),
                client_id=str(m.get("client_id") or ""),
                host=str(m.get("client_host") or ""),
                partitions=assigned_partitions(m.get("member_assignment"), topic),
            )
            for m in described.get("members", [])
        )
        if any(m.partitions is None for m in members):
            self.notes.append("the broker does not say which partitions each tracker owns")
        offsets = self._committed([group]).get(group, {})
        committed = {tp.partition: o for tp, o in offsets.items() if tp.topic == topic}
        return TrackerGroup(group, str(described.get("group_state") or "?"), members, committed)

    def _discover(self, attributed: Iterable[str], opened: OpenDeliveries) -> list[str]:
        prefix = f"kmq.{self.config.queue_topic}."
        groups = {
            str(g["group_id"])[len(prefix) :]
            for g in self.admin.list_groups()
            if str(g.get("group_id", "")).startswith(prefix)
        }
        names = {n for n in groups if not (n.endswith(".retry") and n[: -len(".retry")] in groups)}
        names.update(q for q in attributed if q)
        names.update(d.queue for d in opened.open() if d.queue)
        return sorted(names)

    # -- open deliveries --------------------------------------------------------------------

    def _replay_markers(
        self, tracker: TrackerGroup, ends: dict[TopicPartition, int]
    ) -> OpenDeliveries:
        opened = OpenDeliveries()
        topic = self.config.marker_topic
        ranges = {
            tp: (tracker.committed_offsets.get(tp.partition), end)
            for tp, end in ends.items()
            if tp.topic == topic
        }
        reached = self._scan(ranges, lambda tp, r: opened.apply(tp.partition, r.timestamp, r.value))
        for tp, (_, end) in sorted(ranges.items()):
            if reached.get(tp, 0) < end:
                self.notes.append(
                    f"markers partition {tp.partition} read to {reached.get(tp)} of {end}: "
                    "the in-flight counts may miss deliveries"
                )
        if opened.bad_records:
            self.notes.append(f"{opened.bad_records} markers records could not be decoded")
        return opened

    def _queues_of(self, opened: OpenDeliveries) -> tuple[dict[Delivery, str], int]:
        """The queue of each open version 2 delivery, read from its record's key; and how
        many could not be read."""
        lanes = {QUEUE_LANE: self.config.queue_topic, RETRY_LANE: self.config.retry_topic}
        wanted: dict[TopicPartition, list[int]] = defaultdict(list)
        for d in opened.open():
            if not d.queue and d.lane in lanes:
                wanted[TopicPartition(lanes[d.lane], d.partition)].append(d.offset)
        lane_of = {topic: lane for lane, topic in lanes.items()}
        queue_of: dict[Delivery, str] = {}

        def visit(tp: TopicPartition, record: Any) -> None:
            key = (lane_of[tp.topic], tp.partition, record.offset)
            queue_of[key] = (record.key or b"").decode("utf-8", "replace")

        clusters = {tp: _clusters(sorted(set(offsets))) for tp, offsets in wanted.items()}
        rounds = max((len(c) for c in clusters.values()), default=0)
        for i in range(rounds):
            self._scan({tp: c[i] for tp, c in clusters.items() if i < len(c)}, visit)
        unread = sum(
            1
            for d in opened.open()
            if not d.queue and (d.lane, d.partition, d.offset) not in queue_of
        )
        return queue_of, unread

    # -- counting ----------------------------------------------------------------------------

    def _plan(
        self,
        queue: str,
        control: ControlTable,
        counts: dict[str, int],
        ends: dict[TopicPartition, int],
        committed: dict[str, dict[TopicPartition, int]],
    ) -> dict[str, list[_Count]]:
        cfg = self.config
        key = queue.encode()
        main, retry = (committed.get(g, {}) for g in self._groups(queue))
        backlog: list[_Count] = []
        redelivered: list[_Count] = []
        own = read_partitions(control.layout(cfg.queue_topic), queue, counts[cfg.queue_topic])
        for partition, stop in own.items():
            tp = TopicPartition(cfg.queue_topic, partition)
            end = ends[tp] if stop is None else min(stop, ends[tp])
            backlog.append(_Count(tp, key, main.get(tp), end))
        if counts[cfg.retry_topic]:
            lane = read_partitions(control.layout(cfg.retry_topic), queue, counts[cfg.retry_topic])
            for partition in lane:
                tp = TopicPartition(cfg.retry_topic, partition)
                backlog.append(_Count(tp, key, retry.get(tp), ends[tp]))
                redelivered.append(_Count(tp, key, None, ends[tp]))
        return {"backlog": backlog, "redelivered": redelivered}

    def _count(
        self, plans: dict[str, dict[str, list[_Count]]]
    ) -> tuple[dict[_Count, int], dict[TopicPartition, int]]:
        by_tp: dict[TopicPartition, list[_Count]] = defaultdict(list)
        for plan in plans.values():
            for counts in plan.values():
                for c in counts:
                    if c not in by_tp[c.tp]:
                        by_tp[c.tp].append(c)
        matched: dict[_Count, int] = dict.fromkeys((c for cs in by_tp.values() for c in cs), 0)
        ranges: dict[TopicPartition, tuple[int | None, int]] = {}
        for tp, cs in by_tp.items():
            starts = [c.start for c in cs]
            begin = None if None in starts else min(s for s in starts if s is not None)
            ranges[tp] = (begin, max(c.end for c in cs))

        def visit(tp: TopicPartition, record: Any) -> None:
            for c in by_tp[tp]:
                if record.key == c.key and (c.start or 0) <= record.offset < c.end:
                    matched[c] += 1

        reached = self._scan({tp: r for tp, r in ranges.items() if _wanted(r)}, visit)
        for tp, (begin, _) in ranges.items():
            reached.setdefault(tp, begin or 0)
        return matched, reached

    # -- reading -----------------------------------------------------------------------------

    def _scan(
        self, ranges: dict[TopicPartition, tuple[int | None, int]], visit: Visit
    ) -> dict[TopicPartition, int]:
        """Read each partition from its start (``None``: the log start) up to its end; return
        how far each got. Stops early at the record budget or the deadline."""
        if not ranges:
            return {}
        reader = self.reader
        reader.assign(list(ranges))
        reader.resume(*ranges)  # a partition paused by an earlier scan
        pending = set(ranges)
        for tp, (start, _) in ranges.items():
            if start is None:
                reader.seek_to_beginning(tp)
            else:
                reader.seek(tp, start)
        while pending and self.budget > 0 and time.monotonic() < self.deadline:
            for tp in list(pending):
                if reader.position(tp) >= ranges[tp][1]:
                    pending.discard(tp)
                    reader.pause(tp)
            if not pending:
                break
            batches = reader.poll(timeout_ms=100, max_records=min(2000, self.budget))
            for tp, records in batches.items():
                end = ranges[tp][1]
                for record in records:
                    if record.offset >= end:
                        break
                    visit(tp, record)
                    self.budget -= 1
        reached = {tp: min(reader.position(tp), ranges[tp][1]) for tp in ranges}
        if pending and self.budget <= 0:
            self.notes.append("the scan limit was reached: counts marked <= are upper bounds")
        elif pending:
            self.notes.append(f"the {self.timeout_s:g} s timeout was reached: counts marked <= "
                              "are upper bounds")  # fmt: skip
        return reached


def _total(
    counts: list[_Count], matched: dict[_Count, int], reached: dict[TopicPartition, int]
) -> tuple[int, bool]:
    """The records ``counts`` name, and whether every one of them was read."""
    total, exact = 0, True
    for c in counts:
        n, whole = count_in_range(matched[c], c.start or 0, c.end, reached[c.tp])
        total += n
        exact = exact and whole
    return total, exact


def _wanted(span: tuple[int | None, int]) -> bool:
    start, end = span
    return end > (start or 0)


def _clusters(offsets: list[int]) -> list[tuple[int | None, int]]:
    """Sorted offsets as ``[first, last + 1)`` ranges, split where they lie far apart."""
    out: list[tuple[int | None, int]] = []
    first = prev = offsets[0]
    for offset in offsets[1:]:
        if offset - prev > _GAP:
            out.append((first, prev + 1))
            first = offset
        prev = offset
    out.append((first, prev + 1))
    return out
