"""The machine-readable summary (``summary.json``), built from collected per-queue rows.

Pure Python. The overall figures add up the queues that are not dead-letter queues.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kmq.audit.transforms import BINS_PER_DECADE, EXACT_BELOW_MS, STATUSES

SCHEMA = "kmq.audit/v1"

COUNTS = (
    "sent",
    "delivered",
    "acked",
    "nacked",
    "released",
    "redelivered",
    "messages_redelivered",
    "dead_lettered",
    "in_flight",
    "in_flight_overdue",
    "pending",
    "awaiting_redelivery",
    "lost",
    "duplicate_deliveries",
    "duplicate_starts",
    "acked_more_than_once",
    "orphans",
    "queue_records",
)
"""The count fields of every per-queue and overall entry, in report order."""

METRICS = ("processing_ms", "queue_wait_ms", "end_to_end_ms")
PERCENTILES = (50, 90, 99)
PLOT_BINS_PER_DECADE = 10
CHECKS = ("none", "no-loss", "settled")

Row = Mapping[str, Any]


def percentiles(bins: Iterable[Row]) -> dict[str, Any]:
    """count, mean, max and nearest-rank PERCENTILES of binned values (rows with ``bin``,
    ``count``, ``sum``, ``max``); a percentile is the largest value of the bin it falls in."""
    ordered = sorted(bins, key=lambda r: r["bin"])
    total = sum(int(r["count"]) for r in ordered)
    out: dict[str, Any] = {"count": total, "mean": None, "max": None}
    out.update({f"p{p}": None for p in PERCENTILES})
    if not total:
        return out
    out["mean"] = round(sum(r["sum"] for r in ordered) / total, 3)
    out["max"] = max(r["max"] for r in ordered)
    for p in PERCENTILES:
        rank, seen = max(1, math.ceil(p / 100 * total)), 0
        for r in ordered:
            seen += int(r["count"])
            if seen >= rank:
                out[f"p{p}"] = r["max"]
                break
    return out


def plot_bin(latency_bin: int) -> int:
    """The histogram bin (PLOT_BINS_PER_DECADE per decade; -1 below 1 ms) of a latency bin."""
    if latency_bin < EXACT_BELOW_MS:
        return -1 if latency_bin < 1 else math.floor(math.log10(latency_bin) * PLOT_BINS_PER_DECADE)
    decades = math.log10(EXACT_BELOW_MS)
    step = BINS_PER_DECADE // PLOT_BINS_PER_DECADE
    return round(decades * PLOT_BINS_PER_DECADE) + (latency_bin - EXACT_BELOW_MS) // step


def _by_queue(rows: Iterable[Row], key: str, value: str) -> dict[str, Counter[Any]]:
    out: dict[str, Counter[Any]] = defaultdict(Counter)
    for r in rows:
        out[r["queue"]][r[key]] += int(r[value])
    return out


def _entry(
    counts: Iterable[Row],
    bins: Sequence[Row],
    attempts: Iterable[Counter[Any]],
    causes: Iterable[Counter[Any]],
    reasons: Iterable[Counter[Any]],
    top_reasons: int,
) -> dict[str, Any]:
    totals: Counter[str] = Counter()
    for row in counts:
        totals.update({name: int(row[name] or 0) for name in COUNTS})
    entry: dict[str, Any] = {name: totals[name] for name in COUNTS}
    merged_attempts = sum(attempts, Counter())
    entry["attempts"] = {str(k): merged_attempts[k] for k in sorted(merged_attempts)}
    merged_causes = sum(causes, Counter())
    entry["redelivery_causes"] = {k: merged_causes[k] for k in sorted(merged_causes)}
    merged_reasons = sum(reasons, Counter())
    top = sorted(merged_reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:top_reasons]
    entry["redelivery_reasons"] = dict(top)
    entry["latency_ms"] = {m: percentiles(r for r in bins if r["metric"] == m) for m in METRICS}
    return entry


def build_summary(
    *,
    snapshot: Mapping[str, Any],
    dead_letter_queues: Sequence[str],
    counts: Sequence[Row],
    latency_bins: Sequence[Row],
    attempts: Sequence[Row],
    causes: Sequence[Row],
    reasons: Sequence[Row],
    marker_types: Sequence[Row],
    activity: Sequence[Row],
    bucket_ms: int,
    samples: Mapping[str, Sequence[Row]],
    top_reasons: int = 20,
) -> dict[str, Any]:
    """Assemble ``summary.json`` from the per-queue rows of kmq.audit.transforms."""
    dlqs = set(dead_letter_queues)
    by_attempts = _by_queue(attempts, "attempts", "messages")
    by_cause = _by_queue(causes, "cause", "redeliveries")
    by_reason = _by_queue(reasons, "reason", "redeliveries")
    bins_of: dict[str, list[Row]] = defaultdict(list)
    for r in latency_bins:
        bins_of[r["queue"]].append(r)
    names = sorted({r["queue"] for r in counts})
    queues: dict[str, Any] = {}
    for name in names:
        entry = _entry(
            [r for r in counts if r["queue"] == name],
            bins_of[name],
            [by_attempts[name]],
            [by_cause[name]],
            [by_reason[name]],
            top_reasons,
        )
        queues[name] = {"dead_letter_queue": name in dlqs, **entry}
    kept = [n for n in names if n not in dlqs]
    overall = _entry(
        [r for r in counts if r["queue"] not in dlqs],
        [r for n in kept for r in bins_of[n]],
        [by_attempts[n] for n in kept],
        [by_cause[n] for n in kept],
        [by_reason[n] for n in kept],
        top_reasons,
    )
    histogram: dict[str, Counter[int]] = {m: Counter() for m in METRICS}
    for n in kept:
        for r in bins_of[n]:
            histogram[r["metric"]][plot_bin(int(r["bin"]))] += int(r["count"])
    series_activity: dict[str, list[list[int]]] = {}
    for r in sorted(activity, key=lambda r: (r["series"], r["bucket_ms"])):
        series_activity.setdefault(r["series"], []).append([int(r["bucket_ms"]), int(r["count"])])
    return {
        "schema": SCHEMA,
        "ok": overall["lost"] == 0,
        "settled": overall["lost"] == 0
        and overall["acked"] + overall["dead_lettered"] == overall["sent"],
        "snapshot": {**snapshot, "dead_letter_queues": sorted(dlqs)},
        "overall": overall,
        "queues": queues,
        "markers": {str(r["type"]): int(r["markers"]) for r in sorted(marker_types, key=_type)},
        "samples": {s: [dict(r) for r in samples.get(s, ())] for s in STATUSES if s != "acked"},
        "series": {
            "latency_histogram": {
                m: [[_plot_low(b), n] for b, n in sorted(h.items())] for m, h in histogram.items()
            },
            "activity": {"bucket_ms": bucket_ms, "series": series_activity},
        },
    }


def _plot_low(plot_bin: int) -> float:
    return 0.0 if plot_bin < 0 else round(10 ** (plot_bin / PLOT_BINS_PER_DECADE), 3)


def _type(row: Row) -> str:
    return str(row["type"])


def check_failures(summary: Mapping[str, Any], check: str) -> list[str]:
    """Why ``summary`` fails ``check`` (``none``, ``no-loss``, ``settled``); empty: it passes."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    overall = summary["overall"]
    failures: list[str] = []
    if check in ("no-loss", "settled") and overall["lost"]:
        failures.append(f"{overall['lost']} of {overall['sent']} sent messages lost")
    if check == "settled":
        for status in ("in_flight", "pending", "awaiting_redelivery"):
            if overall[status]:
                failures.append(f"{overall[status]} messages {status.replace('_', ' ')}")
    return failures


def choose_bucket_ms(first_ms: int | None, last_ms: int | None, buckets: int = 60) -> int:
    """A round time bucket giving at most about ``buckets`` buckets over the span."""
    span = max(0, (last_ms or 0) - (first_ms or 0))
    for step in (
        1_000,
        2_000,
        5_000,
        10_000,
        15_000,
        30_000,
        60_000,
        120_000,
        300_000,
        600_000,
        900_000,
        1_800_000,
        3_600_000,
        7_200_000,
        21_600_000,
        43_200_000,
    ):
        if span / step <= buckets:
            return step
    return 86_400_000 * max(1, -(-span // (86_400_000 * buckets)))
