"""Section 6: the cost of the transactional consumer (and, for reference, at-most-once).

Transactional consumer: a batch's START markers and its queue-offset commit go in one Kafka
transaction. (The tracker's redelivery rounds are always fenced transactions since kmq 0.2:
there is no plain tracker left to compare with.)
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from bench.common import JSON, Context, median, ratio
from bench.e2e import max_rates
from bench.pipeline import Run, run_pipeline

TXN: tuple[tuple[str, Any], ...] = (("transactional", True),)


def supported() -> dict[str, bool]:
    from kmq.config import ConsumerConfig

    consumer = {f.name for f in fields(ConsumerConfig)}
    return {
        "consumer_transactional": "transactional" in consumer,
        "at_most_once": "mode" in consumer,
    }


def _throughput(ctx: Context, spec: Run, repeats: int) -> JSON:
    rates: list[float] = []
    cpu: list[JSON] = []
    redelivered: list[int] = []
    never: list[int] = []
    for rep in range(repeats):
        ctx.say(f"transactional: {spec.label} (rep {rep + 1}/{repeats})")
        result = run_pipeline(ctx, spec)
        ctx.say(f"  -> {result['acked_per_s']:,.0f} acked msgs/s")
        rates.append(result["acked_per_s"])
        cpu.append(result["cpu_us_per_msg"])
        redelivered.append(result["consumed"].get("redeliveries", 0))
        never.append(result["consumed"].get("never_redelivered", 0))
    return {
        "acked_per_s": median(rates),
        "samples": rates,
        "cpu_us_per_msg": {k: median([c[k] for c in cpu]) for k in cpu[0]},
        "redelivered": redelivered,
        "never_redelivered": max(never),
    }


def run(ctx: Context) -> JSON:
    support = supported()
    if not support["consumer_transactional"]:
        return {"supported": support, "rows": [], "note": "this kmq has no transactional mode"}
    raw_max, kmq_max = max_rates(ctx)
    count = 6_000 if ctx.quick else 30_000
    repeats = 1 if ctx.quick else 2
    rows: list[JSON] = []
    txn = Run(side="kmq", queues=1, count=count, consumer_options=TXN)
    variants: list[tuple[str, Run]] = [("transactional consumer", txn)]
    if support["at_most_once"] and not ctx.quick:
        amo = Run(
            side="kmq",
            queues=1,
            count=count,
            consumer_options=(("mode", "at_most_once"),),
        )
        variants.append(("at-most-once (no markers; not transactional)", amo))
    txn_max: float | None = None
    for name, spec in variants:
        got = _throughput(ctx, spec, repeats)
        if spec is txn:
            txn_max = got["acked_per_s"]
        rows.append(
            {
                "variant": name,
                "messages": spec.count,
                **got,
                "ratio_vs_raw": ratio(got["acked_per_s"], raw_max),
                "ratio_vs_kmq_default": ratio(got["acked_per_s"], kmq_max),
            }
        )
    out: JSON = {
        "supported": support,
        "baseline": {"raw_acked_per_s": raw_max, "kmq_acked_per_s": kmq_max},
        "rows": rows,
    }
    if ctx.quick:
        return out
    rate = 0.5 * (txn_max or kmq_max)
    seconds = 15.0
    paced = Run(
        side="kmq",
        queues=1,
        count=max(500, int(rate * seconds)),
        rate=rate,
        lease_s=1.0,
        drop_pct=10,
        consumer_options=TXN,
    )
    ctx.say(f"transactional: redelivery 10% dropped, {paced.label}")
    result = run_pipeline(ctx, paced)
    delay = result["consumed"]["redelivery_delay_beyond_lease_ms"]
    ctx.say(f"  -> delay beyond lease p50 {delay['p50']:.0f} ms, p99 {delay['p99']:.0f} ms")
    out["redelivery_10pct"] = {
        "offered_per_s": rate,
        "lease_s": 1.0,
        "dropped": result["consumed"]["dropped"],
        "redelivered": result["consumed"]["redeliveries"],
        "never_redelivered": result["consumed"]["never_redelivered"],
        "delay_beyond_lease_ms": delay,
    }
    spec = Run(
        side="kmq",
        queues=1,
        count=max(200, int(rate * seconds)),
        rate=rate,
        latency=True,
        warmup=int(rate * seconds) // 20,
        consumer_options=TXN,
    )
    ctx.say(f"transactional: latency {spec.label}")
    result = run_pipeline(ctx, spec)
    out["latency"] = {
        "offered_per_s": rate,
        "send_to_receive_ms": result["consumed"]["latency_ms"],
        "recv_to_end_visible_ms": result["recv_to_end_visible_ms"],
    }
    return out
