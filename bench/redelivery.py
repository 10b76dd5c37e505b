"""Section 3: redelivery when x% of messages are lost by their consumer (x = 1, 10)."""

from __future__ import annotations

from bench.common import JSON, Context, ratio
from bench.e2e import max_rates
from bench.pipeline import Run, run_pipeline

LEASE_S = 1.0
DROP_PCTS = (1, 10)


def run(ctx: Context) -> JSON:
    raw_max, kmq_max = max_rates(ctx)
    seconds = 3.0 if ctx.quick else 15.0
    unpaced_count = 40_000
    rows: list[JSON] = []
    for pct in DROP_PCTS:
        rate = 0.5 * kmq_max
        paced = Run(
            side="kmq",
            queues=1,
            count=max(500, int(rate * seconds)),
            rate=rate,
            lease_s=LEASE_S,
            drop_pct=pct,
        )
        ctx.say(f"redelivery {pct}% dropped, {paced.label}")
        delays = run_pipeline(ctx, paced)
        consumed = delays["consumed"]
        delay = consumed["redelivery_delay_beyond_lease_ms"]
        ctx.say(f"  -> delay beyond lease p50 {delay['p50']:.0f} ms, p99 {delay['p99']:.0f} ms")
        row: JSON = {
            "drop_pct": pct,
            "paced": {
                "offered_per_s": rate,
                "messages": paced.count,
                "dropped": consumed["dropped"],
                "redelivered": consumed["redeliveries"],
                "never_redelivered": consumed["never_redelivered"],
                "spurious_redeliveries": consumed["spurious_redeliveries"],
                "delay_beyond_lease_ms": delay,
                "copy_written_beyond_lease_ms": consumed.get("copy_written_beyond_lease_ms"),
                "copy_taken_after_written_ms": consumed.get("copy_taken_after_written_ms"),
            },
            "unpaced": None,
        }
        rows.append(row)
        if ctx.quick:
            continue  # throughput with drops needs a run several leases long
        flat_out = Run(side="kmq", queues=1, count=unpaced_count, lease_s=LEASE_S, drop_pct=pct)
        ctx.say(f"redelivery {pct}% dropped, {flat_out.label}")
        load = run_pipeline(ctx, flat_out)
        lc = load["consumed"]
        first_send = load["produced"]["first_send"]
        main_flow = (lc["acked"] - lc["dropped"]) / (lc["first_attempt_last_ack"] - first_send)
        ctx.say(f"  -> {load['acked_per_s']:,.0f} acked msgs/s all in, main flow {main_flow:,.0f}")
        row["unpaced"] = {
            "messages": flat_out.count,
            "dropped": lc["dropped"],
            "redelivered": lc["redeliveries"],
            "never_redelivered": lc["never_redelivered"],
            "acked_per_s_all_in": load["acked_per_s"],
            "acked_per_s_main_flow": main_flow,
            "ratio_all_in_vs_raw": ratio(load["acked_per_s"], raw_max),
            "ratio_main_flow_vs_raw": ratio(main_flow, raw_max),
            "ratio_main_flow_vs_kmq_no_drops": ratio(main_flow, kmq_max),
        }
    return {
        "settings": {
            "lease_s": LEASE_S,
            "drop": "the consumer receives the message and abandons it without END, NACK or "
            "KEEPALIVE (as a crash would); its redelivered copy is acked",
            "delay": "receive of the copy - receive of the original - lease, from a run paced "
            "at 50% of kmq's max (so no backlog inflates it)",
            "parts": "by wall clock on this one machine: the tracker's part (the copy's record "
            "timestamp, set when the tracker's producer sent it, - the drop - the lease) and "
            "the consumer's (the copy's receive - that timestamp; it includes the copy's "
            "transaction commit)",
            "throughput": "from an unpaced run: 'all in' = every message acked, copies "
            "included, over first send -> last ack (includes one lease of tail); 'main "
            "flow' = first-attempt acks over first send -> last first-attempt ack, while "
            "the tracker is redelivering",
        },
        "baseline": {"raw_acked_per_s": raw_max, "kmq_acked_per_s_no_drops": kmq_max},
        "rows": rows,
    }
