"""Section 7: redelivery behind a standing backlog (the retry lane).

The producer sends 10,000 messages of one queue at once; the consumer works through them
at a fixed pace (``work_ms`` per message), so thousands wait on the queue topic the whole
time. It abandons 1% of first deliveries (as a crashed consumer would) and nacks another
1% with no delay: their copies go to the retry topic, which consumers read first, so they
come back after the lease (or the nack) and not behind the backlog. Raw Kafka has no
redelivery, so there is no baseline; the target is lease + 2 s.
"""

from __future__ import annotations

from bench.common import JSON, Context
from bench.pipeline import Run, run_pipeline

LEASE_S = 1.0
TARGET_BEYOND_LEASE_MS = 2000.0


def run(ctx: Context) -> JSON:
    count = 4_000 if ctx.quick else 10_000
    work_ms = 3.0 if ctx.quick else 2.0
    spec = Run(
        side="kmq",
        queues=1,
        count=count,
        lease_s=LEASE_S,
        drop_pct=1,
        nack_pct=1,
        work_ms=work_ms,
    )
    ctx.say(f"backlog: {spec.label}, {work_ms:g} ms of work per message")
    result = run_pipeline(ctx, spec)
    consumed = result["consumed"]
    delay = consumed["redelivery_delay_beyond_lease_ms"]
    nack = consumed.get("nack_delay_ms")
    ctx.say(
        f"  -> copies of dropped messages: beyond lease p50 {delay['p50']:.0f} ms, "
        f"p99 {delay['p99']:.0f} ms"
    )
    return {
        "settings": {
            "messages": count,
            "work_ms": work_ms,
            "lease_s": LEASE_S,
            "backlog": f"{count:,} messages sent at once, consumed at most "
            f"{1000 / work_ms:,.0f} msgs/s",
        },
        "dropped": consumed["dropped"],
        "redelivered": consumed["redeliveries"],
        "never_redelivered": consumed["never_redelivered"],
        "delay_beyond_lease_ms": delay,
        "nacked": consumed.get("nacked", 0),
        "nack_to_copy_ms": nack,
        "target_beyond_lease_ms": TARGET_BEYOND_LEASE_MS,
    }
