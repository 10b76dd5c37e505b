"""Section 2: latency at 50% of each side's max throughput (one logical queue)."""

from __future__ import annotations

from bench.common import JSON, Context, ratio
from bench.e2e import max_rates
from bench.pipeline import Run, run_pipeline

LOAD = 0.5


def _measure(ctx: Context, side: str, rate: float, seconds: float) -> JSON:
    count = max(200, int(rate * seconds))
    spec = Run(side=side, queues=1, count=count, rate=rate, latency=True, warmup=count // 20)
    ctx.say(f"latency {spec.label}")
    result = run_pipeline(ctx, spec)
    out: JSON = {
        "offered_per_s": rate,
        "messages": count,
        "acked_per_s": result["acked_per_s"],
        "send_to_receive_ms": result["consumed"]["latency_ms"],
    }
    if side == "kmq":
        out["recv_to_end_visible_ms"] = result["recv_to_end_visible_ms"]
    p95 = out["send_to_receive_ms"]["p95"]
    ctx.say(f"  -> send->receive p95 {p95:.1f} ms")
    return out


def run(ctx: Context) -> JSON:
    raw_max, kmq_max = max_rates(ctx)
    seconds = 3.0 if ctx.quick else 15.0
    raw = _measure(ctx, "raw", LOAD * raw_max, seconds)
    kmq = _measure(ctx, "kmq", LOAD * kmq_max, seconds)
    out: JSON = {
        "settings": {
            "load": f"{LOAD:.0%} of each side's single-queue max throughput (section 1)",
            "seconds": seconds,
            "clock": "time.monotonic_ns() stamped in the payload by the producer process",
            "warmup": "first 5% of messages left out of send->receive",
            "end_visible": "when the tracker's PartitionState.on_record gets the END marker "
            "(the real Tracker in a child process, with on_record wrapped)",
        },
        "raw": raw,
        "kmq": kmq,
        "ratio_send_to_receive": {
            p: ratio(kmq["send_to_receive_ms"][p], raw["send_to_receive_ms"][p])
            for p in ("p50", "p95", "p99")
        },
        "ratio_recv_to_end_visible": {
            p: ratio(kmq["recv_to_end_visible_ms"][p], raw["send_to_receive_ms"][p])
            for p in ("p50", "p95", "p99")
        },
    }
    if not ctx.quick:
        # The same offered load for both sides: raw at kmq's 50% rate.
        out["raw_at_kmq_load"] = _measure(ctx, "raw", LOAD * kmq_max, seconds)
    return out
