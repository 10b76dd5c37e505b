"""Section 5: producer throughput and MB/s, kmq.Producer beside a raw KafkaProducer."""

from __future__ import annotations

from bench.common import (
    JSON,
    Children,
    Context,
    create_topics,
    delete_topics,
    new_tag,
    ratio,
)

SIZES = (256, 1024, 8192)


def run(ctx: Context) -> JSON:
    tag = new_tag()
    topics = {
        f"bench.{tag}.prod.raw": 4,
        f"bench.{tag}.prod.queue": 4,
        f"bench.{tag}.prod.markers": 4,
    }
    create_topics(ctx.bootstrap_servers, topics)
    args = {
        "bootstrap_servers": ctx.bootstrap_servers,
        "session_timeout_ms": ctx.session_timeout_ms,
        "raw_topic": f"bench.{tag}.prod.raw",
        "queue_topic": f"bench.{tag}.prod.queue",
        "marker_topic": f"bench.{tag}.prod.markers",
        "partitions": 4,
        "sizes": list(SIZES),
        "async_count": 5_000 if ctx.quick else 40_000,
        "async_bytes": 4_000_000 if ctx.quick else 40_000_000,
        "sync_count": 200 if ctx.quick else 1_500,
    }
    ctx.say(
        f"producer: sizes {list(SIZES)}, {args['async_count']:,} async and "
        f"{args['sync_count']:,} sync sends (and twice as many from 8 threads) "
        "per case and side"
    )
    try:
        with Children(ctx) as children:
            child = children.worker("producer-bench", "producer-bench", args)
            cases = child.wait_event("result", 900)["cases"]
            child.terminate()
    finally:
        delete_topics(ctx.bootstrap_servers, topics)
    rows: list[JSON] = []
    for size in SIZES:
        for mode in ("async", "sync", "sync_threads"):
            pair = {c["side"]: c for c in cases if c["size"] == size and c["mode"] == mode}
            rows.append(
                {
                    "size": size,
                    "mode": mode,
                    "raw": pair["raw"],
                    "kmq": pair["kmq"],
                    "ratio": ratio(pair["kmq"]["msgs_per_s"], pair["raw"]["msgs_per_s"]),
                }
            )
    return {
        "settings": {
            "producer": "acks=all, idempotent, linger_ms=0, batch_size 64 KB, kafka-python's "
            "metrics off, on both sides (kmq's settings)",
            "sync": "each send waits for the broker (future.get() / send(wait=True))",
            "sync_threads": "8 threads, each send waits for the broker; their sends share "
            "requests",
            "async": "sends without waiting, then one flush; the clock includes the flush",
            "async_count": args["async_count"],
            "async_bytes": args["async_bytes"],
            "sync_count": args["sync_count"],
        },
        "rows": rows,
    }
