"""Section 8: the HTTP proxy (``kmq serve``) beside the SDK, on the same broker (issue #13).

Proxy: one ``kmq serve`` replica (plain HTTP on 127.0.0.1, a free port, a bearer token) in
its own process. A sender process posts durable batches of 10 to the native batch send from
a few threads; a receiver process runs a few HTTP clients that each receive with
``max_messages=10`` and ack every batch through the proxy. Direct: the same sender shape
with ``kmq.Producer`` (``send(wait=False)`` per message, ``flush()`` per batch) and one kmq
consumer calling ``receive_many(10)`` and a durable ``ack_many()``, with the proxy's prefetch
as its ``max_in_flight``. A tracker process runs in both; every run has fresh topics.

Each side runs unpaced (throughput: acked messages / first send -> last ack), then paced at
half the slower side's throughput (send->receive latency without a backlog); the same
counts and the same offered load for both. The target: proxy >= 0.5x direct throughput.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from pathlib import Path

from bench.common import (
    JSON,
    Child,
    Children,
    Context,
    cpu_s,
    delete_topics,
    new_tag,
    ratio,
    rss_kb,
)
from bench.pipeline import PARTITIONS, Run, _start_tracker
from kmq.config import ServiceConfig
from kmq.topics import ensure_topics

TARGET_THROUGHPUT_RATIO = 0.5
BATCH = 10
"""Messages per batch send, and max_messages per receive (receive_many on the SDK side)."""
SENDER_THREADS = 4
RECEIVERS = 4
"""Concurrent HTTP clients receiving from the proxy."""
PREFETCH = 100
"""The proxy's --prefetch (its default), and the direct consumer's max_in_flight."""
QUEUE = "q0"
PACED_LOAD = 0.5
"""Latency runs offer this share of the slower side's unpaced throughput, to both sides."""


def _counts(quick: bool) -> int:
    return 2_000 if quick else 20_000


def _paced_seconds(quick: bool) -> float:
    return 3.0 if quick else 15.0


def _available() -> str | None:
    """Why the section cannot run here, or None."""
    try:
        import fastapi  # noqa: F401
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is missing (pip install 'kmq[proxy]' httpx)"
    return None


def _topics(ctx: Context, tag: str) -> JSON:
    topics: JSON = {
        "queue": f"bench.{tag}.queue",
        "markers": f"bench.{tag}.markers",
        "control": f"bench.{tag}.control",
    }
    topics["names"] = [topics["queue"], topics["markers"], topics["control"],
                       f"{topics['queue']}.retry"]  # fmt: skip
    ensure_topics(
        ServiceConfig(
            bootstrap_servers=ctx.bootstrap_servers,
            queue_topic=topics["queue"],
            marker_topic=topics["markers"],
            control_topic=topics["control"],
            queue_partitions=PARTITIONS,
            queue_spread=PARTITIONS,
            marker_partitions=PARTITIONS,
        )
    )
    return topics


def _start_proxy(children: Children, ctx: Context, topics: JSON, token: str) -> tuple[Child, str]:
    """One ``kmq serve`` replica on a free port of 127.0.0.1, once it listens; its URL."""
    tokens = ctx.work_dir / f"proxy-tokens-{new_tag()}"
    tokens.write_text(f"# kmq bench\n{token}\n")
    tokens.chmod(0o600)
    child = children.python(
        "kmq-serve",
        "-m", "kmq.proxy",
        "--bootstrap-servers", ctx.bootstrap_servers,
        "--queue-topic", topics["queue"],
        "--marker-topic", topics["markers"],
        "--control-topic", topics["control"],
        "--host", "127.0.0.1",
        "--port", "0",
        "--secret", secrets.token_hex(32),
        "--tokens-file", str(tokens),
        "--prefetch", str(PREFETCH),
        "--session-timeout-ms", str(ctx.session_timeout_ms),
    )  # fmt: skip
    return child, _listening_url(child, 60)


def _listening_url(child: Child, timeout_s: float) -> str:
    """The URL from the replica's "kmq serve listening on" log line (its stderr)."""
    pattern = re.compile(r"kmq serve listening on (https?://[\d.]+:\d+)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            found = pattern.search(Path(child.log_path).read_text())
            if found:
                return found.group(1)
        if child.proc.poll() is not None:
            raise RuntimeError(f"kmq serve exited with {child.proc.returncode}:\n{child.tail()}")
        time.sleep(0.05)
    raise RuntimeError(f"kmq serve not listening after {timeout_s:.0f} s:\n{child.tail()}")


def _timeout_s(count: int, rate: float) -> float:
    return 90 + (count / rate * 2 if rate else count / 100)


def run_side(ctx: Context, side: str, count: int, rate: float = 0.0, warmup: int = 0) -> JSON:
    """One run: ``side`` "proxy" (HTTP through kmq serve) or "direct" (the SDK)."""
    tag = new_tag()
    topics = _topics(ctx, tag)
    timeout_s = _timeout_s(count, rate)
    kmq_args: JSON = {
        "bootstrap_servers": ctx.bootstrap_servers,
        "session_timeout_ms": ctx.session_timeout_ms,
        "queue_topic": topics["queue"],
        "marker_topic": topics["markers"],
        "control_topic": topics["control"],
    }
    sender_args: JSON = {
        "count": count,
        "size": 100,
        "batch": BATCH,
        "threads": SENDER_THREADS,
        "rate": rate,
        "queue": QUEUE,
    }
    result: JSON = {"side": side, "count": count, "rate": rate, "warmup": warmup}
    try:
        with Children(ctx) as children:
            tracker = _start_tracker(children, ctx, Run(side="kmq", queues=1, count=count),
                                     topics)  # fmt: skip
            proxy: Child | None = None
            if side == "proxy":
                token = secrets.token_hex(16)
                proxy, url = _start_proxy(children, ctx, topics, token)
                http = {"url": url, "token": token}
                receiver = children.worker(
                    "proxy-receive",
                    "proxy-receive",
                    {
                        **http,
                        "queue": QUEUE,
                        "count": count,
                        "clients": RECEIVERS,
                        "max_messages": BATCH,
                        "wait_s": 1.0,
                        "warmup": warmup,
                        "timeout_s": timeout_s,
                    },
                )
                sender_args.update(side="proxy", **http)
            else:
                receiver = children.worker(
                    "consume-kmq",
                    "consume-kmq",
                    {
                        **kmq_args,
                        "queues": [QUEUE],
                        "count": count,
                        "timeout_s": timeout_s,
                        "max_in_flight": PREFETCH,
                        "batch_ack": True,
                        "batch_size": BATCH,
                        "latency": True,
                        "warmup": warmup,
                    },
                )
                sender_args.update(side="kmq", **kmq_args)
            receiver.wait_event("ready", 120)
            tracker.wait_line("caught up", 90)
            sender = children.worker(f"send-{side}", "batch-send", sender_args)
            sender.wait_event("ready", 60)
            cpu0 = {"tracker": cpu_s(tracker.pid)}
            if proxy is not None:
                cpu0["proxy"] = cpu_s(proxy.pid)
            if ctx.broker_pid is not None:
                cpu0["broker"] = cpu_s(ctx.broker_pid)
            sent = sender.wait_event("result", timeout_s)
            received = receiver.wait_event("result", timeout_s)
            cpu = {"sender": sent["cpu_s"], "receiver": received["cpu_s"]}
            cpu["tracker"] = cpu_s(tracker.pid) - cpu0["tracker"]
            if proxy is not None:
                cpu["proxy"] = cpu_s(proxy.pid) - cpu0["proxy"]
            if ctx.broker_pid is not None:
                cpu["broker"] = cpu_s(ctx.broker_pid) - cpu0["broker"]
            if proxy is not None:
                with contextlib.suppress(OSError):
                    result["proxy_rss_kb"] = rss_kb(proxy.pid)
                proxy.terminate(timeout_s=15)
            tracker.terminate()
            receiver.terminate()
            sender.terminate()
    finally:
        delete_topics(ctx.bootstrap_servers, topics["names"])
    errors = received.get("errors") or []
    if errors:
        raise RuntimeError(f"{side}: receiver errors {errors[:3]}")
    acked = received["acked"]
    if not acked or received["done"] is None:
        raise RuntimeError(f"{side}: nothing acked in {timeout_s:.0f} s")
    elapsed = received["done"] - sent["first_send"]
    result.update(
        sent=sent,
        received=received,
        seconds=elapsed,
        acked_per_s=acked / elapsed,
        send_per_s=count / (sent["flushed"] - sent["first_send"]),
        latency_ms=received["latency_ms"],
        cpu_us_per_msg={k: v / max(1, acked) * 1e6 for k, v in cpu.items()},
    )
    if acked < count:
        result["incomplete"] = f"only {acked} of {count} acked before the timeout"
    return result


def _p95(run: JSON) -> float | None:
    value = run["latency_ms"].get("p95")
    return None if value is None else float(value)


def run(ctx: Context) -> JSON:
    missing = _available()
    if missing:
        ctx.say(f"proxy: skipped, {missing}")
        return {"skipped": missing}
    count = _counts(ctx.quick)
    unpaced: JSON = {}
    for side in ("proxy", "direct"):
        ctx.say(f"proxy section: {side}, n={count}, unpaced")
        unpaced[side] = run_side(ctx, side, count)
        r = unpaced[side]
        ctx.say(
            f"  -> {r['acked_per_s']:,.0f} acked msgs/s (sent {r['send_per_s']:,.0f}/s), "
            f"send->receive p95 {_p95(r) or 0:,.0f} ms (backlog included)"
        )
    rate = PACED_LOAD * min(unpaced["proxy"]["acked_per_s"], unpaced["direct"]["acked_per_s"])
    paced_count = max(BATCH * 20, min(count, int(rate * _paced_seconds(ctx.quick))))
    paced_count -= paced_count % BATCH
    warmup = paced_count // 20
    paced: JSON = {}
    for side in ("direct", "proxy"):
        ctx.say(f"proxy section: {side}, n={paced_count}, paced at {rate:,.0f} msgs/s")
        paced[side] = run_side(ctx, side, paced_count, rate=rate, warmup=warmup)
        lat = paced[side]["latency_ms"]
        ctx.say(f"  -> send->receive p50 {lat['p50'] or 0:,.1f} ms, p95 {lat['p95'] or 0:,.1f} ms")
    throughput_ratio = ratio(unpaced["proxy"]["acked_per_s"], unpaced["direct"]["acked_per_s"])
    p95_ratio = ratio(_p95(paced["proxy"]), _p95(paced["direct"]))
    goal_met = throughput_ratio is not None and throughput_ratio >= TARGET_THROUGHPUT_RATIO
    ctx.say(
        f"proxy/direct: throughput {throughput_ratio or 0:.2f}x "
        f"(goal >= {TARGET_THROUGHPUT_RATIO:g}x: {'met' if goal_met else 'not met'}), "
        f"p95 {p95_ratio or 0:.2f}x"
    )
    return {
        "settings": {
            "messages": count,
            "paced_messages": paced_count,
            "payload_bytes": 100,
            "batch": BATCH,
            "sender_threads": SENDER_THREADS,
            "http_receivers": RECEIVERS,
            "prefetch": PREFETCH,
            "partitions": PARTITIONS,
            "paced_rate": rate,
            "paced_load": PACED_LOAD,
            "proxy": f"one `kmq serve` replica (plain HTTP, 127.0.0.1, bearer token, "
            f"--prefetch {PREFETCH}); {SENDER_THREADS} sender threads each posting "
            f"`/messages/batch` of {BATCH}; {RECEIVERS} HTTP clients each `receive` "
            f"(max_messages={BATCH}, wait_s=1) then `ack` of the batch's receipts",
            "direct": f"kmq SDK: {SENDER_THREADS} sender threads each `send(wait=False)` x "
            f"{BATCH} then `flush()`; one consumer (max_in_flight={PREFETCH}), one thread "
            f"calling `receive_many({BATCH})` and a durable `ack_many()`",
        },
        "unpaced": unpaced,
        "paced": paced,
        "throughput_ratio": throughput_ratio,
        "p95_ratio": p95_ratio,
        "p50_ratio": ratio(
            paced["proxy"]["latency_ms"]["p50"], paced["direct"]["latency_ms"]["p50"]
        ),
        "target_throughput_ratio": TARGET_THROUGHPUT_RATIO,
        "goal_met": goal_met,
    }
