"""Section 1: end-to-end throughput, kmq beside raw Kafka, with 1, 4 and 16 logical queues."""

from __future__ import annotations

from bench.common import JSON, Context, median, ratio
from bench.pipeline import Run, run_pipeline

QUEUE_COUNTS = (1, 4, 16)
DURABLE = "kmq durable"
"""Section 1's third side at 1 queue: kmq with ``receive_many(100)`` and a durable
``ack_many`` per batch."""


def _counts(quick: bool) -> dict[int, int]:
    if quick:
        return {1: 6_000, 4: 6_000, 16: 3_200}
    # Long enough that each side's figure is its steady state rather than its first and last
    # batches: at 16,000 messages over 16 queues raw was done in 0.3 s, and kmq measured
    # 0.34-0.42x of it against 0.47-0.49x at 64,000 and 160,000 in the same runs
    # (bench/run_length.py; bench/results/run-length-16q.md).
    return {1: 160_000, 4: 160_000, 16: 160_000}


def _summary(runs: list[JSON]) -> JSON:
    rates = [r["acked_per_s"] for r in runs]
    written = next((r["bytes_written"] for r in runs if "bytes_written" in r), None)
    return {
        "bytes_written": written,
        "acked_per_s": median(rates),
        "samples": rates,
        "produce_per_s": median([r["produce_per_s"] for r in runs]),
        "tracker_rss_kb": runs[-1].get("tracker_rss_kb"),
        "consumer_rss_kb": runs[-1]["consumed"].get("rss_kb"),
        "duplicates": sum(r["consumed"]["duplicates"] for r in runs),
        "incomplete": [r["incomplete"] for r in runs if "incomplete" in r],
        "cpu_us_per_msg": {
            k: median([r["cpu_us_per_msg"][k] for r in runs]) for k in runs[0]["cpu_us_per_msg"]
        },
    }


def run(ctx: Context) -> JSON:
    repeats = 1 if ctx.quick else 3
    counts = _counts(ctx.quick)
    rows: list[JSON] = []
    durable: list[JSON] = []
    for queues in QUEUE_COUNTS:
        samples: dict[str, list[JSON]] = {"raw": [], "kmq": [], DURABLE: []}
        # At 1 queue the durable batch loop takes turns with the other two: its target is a
        # ratio to kmq's wait=False figure, and measured minutes apart (after the 4- and
        # 16-queue rows, as it was until 2026-12-07) the two met a differently loaded
        # machine; that row moved more between runs than any other.
        sides = ("raw", "kmq", DURABLE) if queues == 1 else ("raw", "kmq")
        for rep in range(repeats):
            order = sides if rep % 2 == 0 else sides[::-1]
            for side in order:
                spec = Run(
                    side="kmq" if side == DURABLE else side,
                    queues=queues,
                    count=counts[queues],
                    measure_bytes=queues == 1 and rep == 0 and side != DURABLE,
                    batch_ack=side == DURABLE,
                )
                ctx.say(f"e2e {spec.label} (rep {rep + 1}/{repeats})")
                result = run_pipeline(ctx, spec)
                ctx.say(f"  -> {result['acked_per_s']:,.0f} acked msgs/s")
                samples[side].append(result)
        durable.extend(samples[DURABLE])
        raw, kmq = _summary(samples["raw"]), _summary(samples["kmq"])
        rows.append(
            {
                "queues": queues,
                "messages": counts[queues],
                "raw": raw,
                "kmq": kmq,
                "ratio": ratio(kmq["acked_per_s"], raw["acked_per_s"]),
            }
        )
    variants: list[tuple[str, Run, list[JSON]]] = [
        ("receive_many + durable ack_many", Run(side="kmq", queues=1, count=counts[1],
                                                batch_ack=True), durable),
    ]  # fmt: skip
    if not ctx.quick:
        wait = Run(side="kmq", queues=1, count=2_000, ack_wait=True)
        ctx.say(f"e2e {wait.label}")
        variants.append(("ack(wait=True)", wait, [run_pipeline(ctx, wait)]))
    extra: list[JSON] = []
    for name, spec, results in variants:
        summary = _summary(results)
        ctx.say(f"  {name} -> {summary['acked_per_s']:,.0f} acked msgs/s")
        extra.append(
            {
                "queues": 1,
                "messages": spec.count,
                "variant": name,
                "ack_wait": spec.ack_wait,
                "kmq": summary,
                "raw_acked_per_s": rows[0]["raw"]["acked_per_s"],
                "kmq_wait_false_acked_per_s": rows[0]["kmq"]["acked_per_s"],
                "ratio": ratio(summary["acked_per_s"], rows[0]["raw"]["acked_per_s"]),
                "vs_wait_false": ratio(summary["acked_per_s"], rows[0]["kmq"]["acked_per_s"]),
            }
        )
    sizes: list[JSON] = []
    for row in rows[:1]:
        for side in ("raw", "kmq"):
            written = row[side].get("bytes_written")
            if written:
                sizes.append({"payload_bytes": 100, "side": side, **written})
    big = 1_000 if ctx.quick else 5_000
    for side in ("raw", "kmq"):
        spec = Run(side=side, queues=1, count=big, payload_bytes=10_240, measure_bytes=True)
        ctx.say(f"e2e {spec.label} (bytes written)")
        result = run_pipeline(ctx, spec)
        sizes.append({"payload_bytes": 10_240, "side": side, **result["bytes_written"]})
    return {
        "settings": {
            "payload_bytes": 100,
            "ack": "msg.ack(wait=False); ENDs flushed before the clock stops",
            "partitions": 4,
            "kmq_layout": "queue topic of 4 partitions per queue, each queue spread over 4, "
            "the queues declared at creation (placed apart)",
            "max_in_flight": 500,
            "repeats": repeats,
            "raw_topology": "one topic and one consumer group per logical queue",
            "kmq_topology": "one queue topic, 4 partitions per logical queue (each queue's "
            "records on 4 of its own, placed when the topic is created); one consumer group "
            "per logical queue reading only its queue's partitions; one tracker process",
        },
        "rows": rows,
        "ack_wait": extra,
        "bytes_written": sizes,
    }


def max_rates(ctx: Context) -> tuple[float, float]:
    """(raw, kmq) single-queue max throughput: from section 1 if it ran, else measured."""
    e2e = ctx.results.get("e2e")
    if e2e:
        row = e2e["rows"][0]
        return row["raw"]["acked_per_s"], row["kmq"]["acked_per_s"]
    count = 4_000 if ctx.quick else 20_000
    found: list[float] = []
    for side in ("raw", "kmq"):
        ctx.say(f"calibrating {side} max throughput ({count} messages, 1 queue)")
        found.append(run_pipeline(ctx, Run(side=side, queues=1, count=count))["acked_per_s"])
    return found[0], found[1]
