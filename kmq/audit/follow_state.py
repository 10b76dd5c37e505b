"""The state of ``kmq audit --follow``: every unsettled message, and windowed statistics.

Pure Python, no Spark: each micro-batch hands over its queue records and its markers
compacted per delivery; :meth:`FollowState.apply` merges them and :meth:`FollowState.view`
judges every message as of a time, with the rules of the batch audit (docs/audit.md).

The state is bounded: a settled message (acked or dead-lettered, nothing open or pending)
leaves once the watermark (the newest event seen, or the clock when that is later, minus
``settled_horizon_ms``) passes its last event; markers whose record never arrives (cut off
by retention, or from elsewhere) leave after ``orphan_after_ms`` and are counted as
orphans; window buckets older than ``window_ms`` are dropped.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kmq.audit.summary import percentiles
from kmq.markers import MarkerType

Key = tuple[int, int, int]
"""A delivery: (lane, partition, offset) of its record."""
MessageKey = tuple[str, str]
"""A message: (queue, message id)."""

GIVEBACK = {int(MarkerType.NACK), int(MarkerType.RELEASE), int(MarkerType.REJECT)}
BUCKET_MS = 1000
EXACT_BELOW_MS = 1000
BINS_PER_DECADE = 200
WINDOW_METRICS = ("processing_ms", "end_to_end_ms")


@dataclass(frozen=True)
class FollowLimits:
    """When a message is stuck, and how long what is settled stays in the state."""

    stuck_leases: float = 3.0
    """Flag a message in flight for longer than this many of its leases."""
    pending_bound_ms: int = 60_000
    """Flag a message sent (or copied) but not STARTed after this long."""
    window_ms: int = 300_000
    settled_horizon_ms: int = 60_000
    orphan_after_ms: int = 120_000


@dataclass(slots=True)
class Delivery:
    """One queue-topic or retry-topic record and what its markers said so far."""

    queue: str | None = None
    message_id: str | None = None
    attempt: int | None = None
    on_queue: bool = False
    sent_ms: int | None = None
    starts: int = 0
    first_start_ms: int | None = None
    last_start_pos: int | None = None
    last_start_ms: int | None = None
    lease_ms: int | None = None
    end_ms: int | None = None
    last_settle_pos: int | None = None
    last_settle_type: int | None = None
    redelivered_ms: int | None = None
    dead_lettered: bool = False
    first_marker_ms: int | None = None
    counted_end: bool = False

    @property
    def open(self) -> bool:
        return self.starts > 0 and (
            self.last_settle_pos is None
            or (self.last_start_pos is not None and self.last_settle_pos < self.last_start_pos)
        )

    def merge_markers(self, row: Mapping[str, Any]) -> None:
        """Fold in one micro-batch's markers of this delivery (a compacted row)."""
        self.starts += int(row.get("starts") or 0)
        self.first_start_ms = _min(self.first_start_ms, row.get("first_start_ms"))
        pos = row.get("last_start_pos")
        if pos is not None and (self.last_start_pos is None or pos > self.last_start_pos):
            self.last_start_pos, self.last_start_ms = pos, row.get("last_start_ms")
            self.attempt = self.attempt if self.on_queue else row.get("m_attempt") or self.attempt
        self.lease_ms = _max(self.lease_ms, row.get("lease_ms"))
        self.end_ms = _min(self.end_ms, row.get("end_ms"))
        pos = row.get("last_settle_pos")
        if pos is not None and (self.last_settle_pos is None or pos > self.last_settle_pos):
            self.last_settle_pos, self.last_settle_type = pos, row.get("last_settle_type")
        self.redelivered_ms = _min(self.redelivered_ms, row.get("redelivered_ms"))
        self.dead_lettered = self.dead_lettered or bool(row.get("dead_lettered"))
        self.first_marker_ms = _min(self.first_marker_ms, row.get("first_ms"))


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def latency_bin(value_ms: int) -> int:
    """As kmq.audit.transforms.latency_bin: exact below 1 s, 200 log bins per decade above."""
    if value_ms < EXACT_BELOW_MS:
        return value_ms
    return EXACT_BELOW_MS + math.floor((math.log10(value_ms) - 3) * BINS_PER_DECADE)


@dataclass
class Message:
    deliveries: dict[Key, Delivery] = field(default_factory=dict)
    counted_sent: bool = False
    counted_acked: bool = False
    counted_dead: bool = False
    counted_redeliveries: int = 0

    def status(self) -> str:
        ds = self.deliveries.values()
        if any(d.end_ms is not None for d in ds):
            return "acked"
        started = [d for d in ds if d.starts > 0 and d.last_start_pos is not None]
        latest = max(started, key=lambda d: d.last_start_pos or 0, default=None)
        if latest is not None and latest.open:
            return "in_flight"
        if any(d.on_queue and d.starts == 0 for d in ds):
            return "pending"
        if any(d.dead_lettered for d in ds):
            return "dead_lettered"
        if latest is not None and latest.last_settle_type in GIVEBACK:
            return "awaiting_redelivery"
        return "lost"

    @property
    def sent(self) -> bool:
        return any(d.on_queue and d.attempt == 1 for d in self.deliveries.values())

    def sent_ms(self) -> int | None:
        times = [d.sent_ms for d in self.deliveries.values() if d.on_queue and d.attempt == 1]
        return min((t for t in times if t is not None), default=None)

    def last_event_ms(self) -> int:
        times = [
            t
            for d in self.deliveries.values()
            for t in (d.sent_ms, d.last_start_ms, d.end_ms, d.redelivered_ms, d.first_marker_ms)
            if t is not None
        ]
        return max(times, default=0)

    def latest(self) -> Delivery | None:
        started = [d for d in self.deliveries.values() if d.last_start_pos is not None]
        return max(started, key=lambda d: d.last_start_pos or 0, default=None)


@dataclass
class FollowState:
    """Unsettled messages and windowed counts; ``batch_id`` is the last micro-batch applied."""

    limits: FollowLimits = field(default_factory=FollowLimits)
    batch_id: int = -1
    messages: dict[MessageKey, Message] = field(default_factory=dict)
    index: dict[Key, MessageKey] = field(default_factory=dict)
    unresolved: dict[Key, Delivery] = field(default_factory=dict)
    """Deliveries known only from version 2 markers, waiting for their record."""
    max_event_ms: int = 0
    markers: Counter[str] = field(default_factory=Counter)
    bad_input: Counter[str] = field(default_factory=Counter)
    window: dict[int, dict[str, Counter[Any]]] = field(default_factory=dict)
    """Per bucket start: ``counts`` (queue, name) -> n and ``bins`` (queue, metric, bin) ->
    [count, sum, max] (kept as three counters: ``bins``, ``sums``, ``maxes``)."""

    # -- merging ------------------------------------------------------------------------

    def apply(
        self,
        batch_id: int,
        records: Iterable[Mapping[str, Any]],
        marker_rows: Iterable[Mapping[str, Any]],
        marker_counts: Mapping[str, int],
        bad_input: Mapping[str, int] | None = None,
    ) -> bool:
        """Merge one micro-batch; False (and nothing changes) when it was applied already."""
        if batch_id <= self.batch_id:
            return False
        touched: set[MessageKey] = set()
        for r in records:
            key: Key = (int(r["lane"]), int(r["partition"]), int(r["offset"]))
            mk = self.index.get(key)
            d = self.unresolved.pop(key, None) or (
                self.messages[mk].deliveries.pop(key) if mk in self.messages else Delivery()
            )
            d.queue, d.message_id, d.attempt = r["queue"] or "", r["message_id"], r["attempt"]
            d.on_queue, d.sent_ms = True, r["sent_ms"]
            touched.add(self._attach(key, d))
            self._see(r["sent_ms"])
        for m in marker_rows:
            key = (int(m["lane"]), int(m["partition"]), int(m["offset"]))
            self._see(m.get("last_ms"))
            mk = self.index.get(key)
            if mk is not None and mk in self.messages:
                self.messages[mk].deliveries[key].merge_markers(m)
                touched.add(mk)
            elif m.get("m_message_id"):  # a version 1 marker names its message
                d = Delivery(queue=m.get("m_queue") or "", message_id=m["m_message_id"])
                d.attempt = m.get("m_attempt")
                d.merge_markers(m)
                touched.add(self._attach(key, d))
            else:
                self.unresolved.setdefault(key, Delivery()).merge_markers(m)
        self.markers.update(marker_counts)
        self.bad_input.update(bad_input or {})
        for mk in touched:
            self._count(mk)
        self.batch_id = batch_id
        return True

    def _see(self, ts: int | None) -> None:
        if ts is not None and ts > self.max_event_ms:
            self.max_event_ms = ts

    def _attach(self, key: Key, d: Delivery) -> MessageKey:
        mk = (d.queue or "", d.message_id or f"ext-{key[1]}-{key[2]}")
        self.messages.setdefault(mk, Message()).deliveries[key] = d
        self.index[key] = mk
        return mk

    def _add(self, ts: int | None, queue: str, name: str) -> None:
        if ts is not None:
            bucket = self.window.setdefault(ts - ts % BUCKET_MS, _bucket())
            bucket["counts"][(queue, name)] += 1

    def _latency(self, ts: int | None, queue: str, metric: str, value: int | None) -> None:
        if ts is None or value is None or value < 0:
            return
        bucket = self.window.setdefault(ts - ts % BUCKET_MS, _bucket())
        k = (queue, metric, latency_bin(value))
        bucket["bins"][k] += 1
        bucket["sums"][k] += value
        bucket["maxes"][k] = max(bucket["maxes"][k], value)

    def _count(self, mk: MessageKey) -> None:
        """Count each message's events in the window once, when they are first seen."""
        msg, queue = self.messages[mk], mk[0]
        if msg.sent and not msg.counted_sent:
            msg.counted_sent = True
            self._add(msg.sent_ms(), queue, "sent")
        for d in msg.deliveries.values():
            if d.end_ms is not None and not d.counted_end:
                d.counted_end = True
                if d.first_start_ms is not None:
                    self._latency(d.end_ms, queue, "processing_ms", d.end_ms - d.first_start_ms)
        redeliveries = sum(d.redelivered_ms is not None for d in msg.deliveries.values())
        if redeliveries > msg.counted_redeliveries:
            last = max(d.redelivered_ms or 0 for d in msg.deliveries.values())
            for _ in range(redeliveries - msg.counted_redeliveries):
                self._add(last, queue, "redelivered")
            msg.counted_redeliveries = redeliveries
        status = msg.status()
        if status == "acked" and not msg.counted_acked:
            msg.counted_acked = True
            acked = min(d.end_ms for d in msg.deliveries.values() if d.end_ms is not None)
            self._add(acked, queue, "acked")
            sent = msg.sent_ms()
            if sent is not None:
                self._latency(acked, queue, "end_to_end_ms", acked - sent)
        if status == "dead_lettered" and not msg.counted_dead:
            msg.counted_dead = True
            self._add(msg.last_event_ms(), queue, "dead_lettered")

    # -- eviction -----------------------------------------------------------------------

    def evict(self, now_ms: int) -> None:
        """Drop settled messages past the watermark, orphans, and old window buckets."""
        # Event time, or the clock when nothing newer arrives (producers' clocks are close).
        watermark = max(self.max_event_ms, now_ms) - self.limits.settled_horizon_ms
        for mk in list(self.messages):
            msg = self.messages[mk]
            status = msg.status()
            settled = status in ("acked", "dead_lettered")
            if settled and msg.last_event_ms() < watermark:
                self._drop(mk)
            elif not msg.sent and msg.last_event_ms() < now_ms - self.limits.orphan_after_ms:
                self.bad_input["orphan_messages"] += 1  # markers or copies, no original
                self._drop(mk)
        for key in list(self.unresolved):
            d = self.unresolved[key]
            if (d.first_marker_ms or 0) < now_ms - self.limits.orphan_after_ms:
                del self.unresolved[key]
                kind = (
                    "orphan_end"
                    if d.end_ms is not None
                    else "orphan_start"
                    if d.starts
                    else ("orphan_other")
                )
                self.bad_input[kind] += 1
        oldest = now_ms - self.limits.window_ms
        for start in [b for b in self.window if b + BUCKET_MS <= oldest]:
            del self.window[start]

    def _drop(self, mk: MessageKey) -> None:
        for key in self.messages.pop(mk).deliveries:
            self.index.pop(key, None)

    # -- judging ------------------------------------------------------------------------

    def view(self, now_ms: int) -> dict[str, Any]:
        """Current statuses, stuck messages and the window's figures, as of ``now_ms``."""
        lim = self.limits
        current: dict[str, Counter[str]] = {}
        stuck: list[dict[str, Any]] = []
        for (queue, mid), msg in self.messages.items():
            status = msg.status()
            counts = current.setdefault(queue, Counter())
            counts[status if msg.sent else "orphans"] += 1
            latest = msg.latest()
            if status == "in_flight" and latest is not None and latest.last_start_ms is not None:
                lease = latest.lease_ms or 0
                age = now_ms - latest.last_start_ms
                if lease > 0 and age > lim.stuck_leases * lease:
                    stuck.append(_stuck(queue, mid, "in_flight_too_long", latest, age, lease))
            elif status == "pending":
                since = min(
                    (d.sent_ms for d in msg.deliveries.values()
                     if d.on_queue and d.starts == 0 and d.sent_ms is not None),
                    default=None,
                )  # fmt: skip
                if since is not None and now_ms - since > lim.pending_bound_ms:
                    stuck.append(_stuck(queue, mid, "never_started", None, now_ms - since, None))
        for row in stuck:
            current.setdefault(row["queue"], Counter())["stuck"] += 1
        stuck.sort(key=lambda r: (-r["age_ms"], r["queue"], r["message_id"]))
        return {
            "current": {q: dict(c) for q, c in sorted(current.items())},
            "stuck": stuck,
            "window": self._window(now_ms),
        }

    def _window(self, now_ms: int) -> dict[str, Any]:
        oldest = now_ms - self.limits.window_ms
        counts: dict[str, Counter[str]] = {}
        bins: dict[tuple[str, str], dict[int, list[int]]] = {}
        for start, bucket in self.window.items():
            if start + BUCKET_MS <= oldest:
                continue
            for (queue, name), n in bucket["counts"].items():
                counts.setdefault(queue, Counter())[name] += n
            for (queue, metric, b), n in bucket["bins"].items():
                acc = bins.setdefault((queue, metric), {}).setdefault(b, [0, 0, 0])
                k = (queue, metric, b)
                acc[0] += n
                acc[1] += bucket["sums"][k]
                acc[2] = max(acc[2], bucket["maxes"][k])
        out: dict[str, Any] = {}
        for queue in sorted({*counts, *(q for q, _ in bins)}):
            c = counts.get(queue, Counter())
            entry: dict[str, Any] = {
                n: c[n] for n in ("sent", "acked", "redelivered", "dead_lettered")
            }
            entry["latency_ms"] = {
                metric: percentiles(
                    {"bin": b, "count": v[0], "sum": v[1], "max": v[2]}
                    for b, v in bins.get((queue, metric), {}).items()
                )
                for metric in WINDOW_METRICS
            }
            out[queue] = entry
        return out

    # -- persistence ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "max_event_ms": self.max_event_ms,
            "markers": dict(self.markers),
            "bad_input": dict(self.bad_input),
            "messages": [[list(mk), _message_json(msg)] for mk, msg in self.messages.items()],
            "unresolved": [[list(k), asdict(d)] for k, d in self.unresolved.items()],
            "window": [
                [start, {part: [[list(k), v] for k, v in c.items()] for part, c in b.items()}]
                for start, b in self.window.items()
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], limits: FollowLimits) -> FollowState:
        state = cls(limits=limits, batch_id=int(data["batch_id"]))
        state.max_event_ms = int(data["max_event_ms"])
        state.markers.update(data["markers"])
        state.bad_input.update(data["bad_input"])
        for mk_list, raw in data["messages"]:
            mk = (mk_list[0], mk_list[1])
            msg = Message(
                counted_sent=raw["counted_sent"],
                counted_acked=raw["counted_acked"],
                counted_dead=raw["counted_dead"],
                counted_redeliveries=raw["counted_redeliveries"],
            )
            for k, d in raw["deliveries"]:
                key = (int(k[0]), int(k[1]), int(k[2]))
                msg.deliveries[key] = Delivery(**d)
                state.index[key] = mk
            state.messages[mk] = msg
        for k, d in data["unresolved"]:
            state.unresolved[(int(k[0]), int(k[1]), int(k[2]))] = Delivery(**d)
        for start, parts in data["window"]:
            bucket = _bucket()
            for part, items in parts.items():
                for k, v in items:
                    bucket[part][tuple(k)] = v
            state.window[int(start)] = bucket
        return state

    def size(self) -> dict[str, int]:
        return {
            "messages": len(self.messages),
            "deliveries": len(self.index),
            "unresolved": len(self.unresolved),
            "window_buckets": len(self.window),
        }


def _bucket() -> dict[str, Counter[Any]]:
    return {"counts": Counter(), "bins": Counter(), "sums": Counter(), "maxes": Counter()}


def _message_json(msg: Message) -> dict[str, Any]:
    return {
        "counted_sent": msg.counted_sent,
        "counted_acked": msg.counted_acked,
        "counted_dead": msg.counted_dead,
        "counted_redeliveries": msg.counted_redeliveries,
        "deliveries": [[list(k), asdict(d)] for k, d in msg.deliveries.items()],
    }


def _stuck(
    queue: str, mid: str, why: str, d: Delivery | None, age_ms: int, lease_ms: int | None
) -> dict[str, Any]:
    return {
        "queue": queue,
        "message_id": mid,
        "why": why,
        "age_ms": age_ms,
        "attempt": d.attempt if d is not None else None,
        "lease_ms": lease_ms,
    }
