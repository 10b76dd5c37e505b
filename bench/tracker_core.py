"""Section 4: the tracker's pure state object — marker events per second on one core, and
memory per in-flight message. Each measurement runs in a fresh child process."""

from __future__ import annotations

import cProfile
import gc
import io
import os
import pstats
import time
import uuid
from typing import Any

from bench.common import JSON, Children, Context, median, mem_available_bytes

LEASE_MS = 30_000


def new_state() -> Any:
    """A PartitionState configured as tracker.daemon builds it: without payloads in memory
    when this version of the state supports that (``keep_payloads=False``)."""
    import inspect

    from tracker.state import PartitionState

    if "keep_payloads" in inspect.signature(PartitionState).parameters:
        return PartitionState(0, keep_payloads=False)
    return PartitionState(0)


def state_settings() -> str:
    import inspect

    from tracker.state import PartitionState

    if "keep_payloads" in inspect.signature(PartitionState).parameters:
        return "PartitionState(keep_payloads=False), as tracker.daemon builds it"
    return "PartitionState() (this version keeps START payloads in memory)"


def _marker(kind: Any, i: int, payload: bytes) -> bytes:
    from kmq.markers import Marker, MarkerType, encode

    start = kind is MarkerType.START
    return encode(
        Marker(
            type=kind,
            queue="bench",
            partition=i % 4,
            offset=i // 4,
            message_id=f"{i:032x}",
            attempt=1,
            redeliver_after_ms=LEASE_MS if kind is not MarkerType.END else 0,
            key=b"bench" if start else b"",
            value=payload if start else b"",
        )
    )


def marker_stream(messages: int, window: int, payload_bytes: int = 100) -> list[bytes]:
    """START, KEEPALIVE and END in equal shares, about ``window`` messages in flight: message
    i starts, message i - window/2 is kept alive and message i - window ends."""
    from kmq.markers import MarkerType

    payload = b"p" * payload_bytes
    half = window // 2
    events: list[bytes] = []
    for i in range(messages + window):
        if i < messages:
            events.append(_marker(MarkerType.START, i, payload))
        if half <= i < messages + half:
            events.append(_marker(MarkerType.KEEPALIVE, i - half, payload))
        if window <= i:
            events.append(_marker(MarkerType.END, i - window, payload))
    return events


def batched(messages: int, window: int, per_record: int) -> list[bytes] | None:
    """The same marker stream, ``per_record`` markers to a BATCH record, as kmq consumers
    write them when the codec supports it (None otherwise)."""
    import kmq.markers as markers_mod
    from kmq.markers import Marker, MarkerType

    encode_batch = getattr(markers_mod, "encode_batch", None)
    if encode_batch is None:
        return None
    payload = b"p" * 100
    half = window // 2
    markers: list[Marker] = []

    def add(kind: MarkerType, i: int) -> None:
        start = kind is MarkerType.START
        markers.append(
            Marker(
                type=kind,
                queue="bench",
                partition=i % 4,
                offset=i // 4,
                message_id=f"{i:032x}",
                attempt=1,
                redeliver_after_ms=LEASE_MS if kind is not MarkerType.END else 0,
                key=b"bench" if start else b"",
                value=payload if start else b"",
            )
        )

    for i in range(messages + window):
        if i < messages:
            add(MarkerType.START, i)
        if half <= i < messages + half:
            add(MarkerType.KEEPALIVE, i - half)
        if window <= i:
            add(MarkerType.END, i - window)
    return [encode_batch(markers[i : i + per_record]) for i in range(0, len(markers), per_record)]


def _feed(events: list[bytes], *, complete: bool = True) -> float:
    state = new_state()
    base = 1000.0
    on_record = state.on_record
    gc.collect()
    start = time.perf_counter()
    for offset, value in enumerate(events):
        on_record(offset, value, base + offset * 1e-5)
    elapsed = time.perf_counter() - start
    if complete and state.in_flight:
        raise RuntimeError(f"{state.in_flight} messages still in flight after every END")
    return elapsed


def run_core(a: JSON) -> JSON:
    """In the child: events/s through PartitionState.on_record (decode included), the
    decode-only rate, and a cProfile of one pass."""
    from kmq.markers import decode

    events = marker_stream(a["messages"], a["window"])
    runs = [len(events) / _feed(events) for _ in range(a["repeats"])]
    start = time.perf_counter()
    for value in events:
        decode(value)
    decode_rate = len(events) / (time.perf_counter() - start)
    profiler = cProfile.Profile()
    profiler.enable()
    _feed(events[: min(len(events), 150_000)], complete=False)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(12)
    top = [line for line in text.getvalue().splitlines() if line.strip()][-13:]
    per_record = a.get("per_record", 50)
    records = batched(a["messages"], a["window"], per_record)
    batch_runs: list[float] = []
    if records is not None:
        batch_runs = [len(events) / _feed(records) for _ in range(a["repeats"])]
    return {
        "batched": None
        if records is None
        else {
            "markers_per_record": per_record,
            "records": len(records),
            "events_per_s": batch_runs,
            "events_per_s_median": median(batch_runs),
            "events_per_s_best": max(batch_runs),
        },
        "events": len(events),
        "window": a["window"],
        "events_per_s": runs,
        "events_per_s_median": median(runs),
        "events_per_s_best": max(runs),
        "decode_only_per_s": decode_rate,
        "profile_top_tottime": top,
        "state": state_settings(),
    }


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_rss(a: JSON) -> JSON:
    """In the child: feed ``count`` encoded START markers (fresh ids, ``size``-byte payloads)
    to one PartitionState and report the growth of this process's RSS per message."""
    from kmq.markers import Marker, MarkerType, encode

    count: int = a["count"]
    payload = os.urandom(a["size"])
    state = new_state()
    now = 1000.0
    # Warm up allocator pools and imports with a few markers, then measure from here.
    for i in range(1000):
        state.on_record(i, _marker(MarkerType.START, i, payload), now)
    gc.collect()
    before = _rss_bytes()
    start = time.perf_counter()
    for i in range(1000, 1000 + count):
        value = encode(
            Marker(
                type=MarkerType.START,
                queue="bench",
                partition=i % 4,
                offset=i // 4,
                message_id=uuid.uuid4().hex,
                attempt=1,
                redeliver_after_ms=LEASE_MS,
                key=b"bench",
                value=payload,
            )
        )
        state.on_record(i, value, now + i * 1e-6)
    elapsed = time.perf_counter() - start
    gc.collect()
    after = _rss_bytes()
    return {
        "count": count,
        "payload_bytes": a["size"],
        "in_flight": state.in_flight,
        "rss_before_mib": before / 2**20,
        "rss_after_mib": after / 2**20,
        "bytes_per_in_flight": (after - before) / count,
        "seconds": elapsed,
        "state": state_settings(),
    }


# -- orchestration ----------------------------------------------------------------------


def run(ctx: Context) -> JSON:
    quick = ctx.quick
    core_args = {"messages": 20_000 if quick else 100_000, "window": 1000, "repeats": 3}
    with Children(ctx) as children:
        ctx.say(f"tracker core: {3 * core_args['messages']:,} marker events x3")
        core = children.worker("tracker-core", "tracker-core", core_args)
        core_result = core.wait_event("result", 300)
        core.terminate()
    rss: list[JSON] = []
    counts = [100_000] if quick else [100_000, 1_000_000]
    sizes = [100, 10_240]
    per_msg: dict[int, float] = {}
    for count in counts:
        for size in sizes:
            guess = per_msg.get(size)
            if guess is not None:
                projected = guess * count
                budget = 0.4 * mem_available_bytes()
                if projected > budget:
                    ctx.say(
                        f"tracker RSS: skipping {count:,} x {size} B "
                        f"(projected {projected / 2**30:.1f} GiB > 40% of available RAM)"
                    )
                    rss.append(
                        {
                            "count": count,
                            "payload_bytes": size,
                            "skipped": True,
                            "projected_gib": projected / 2**30,
                            "bytes_per_in_flight": guess,
                            "note": "extrapolated linearly from the 100k run",
                        }
                    )
                    continue
            ctx.say(f"tracker RSS: {count:,} in-flight STARTs with {size} B payloads")
            with Children(ctx) as children:
                child = children.worker(
                    f"tracker-rss-{count}-{size}",
                    "tracker-rss",
                    {"count": count, "size": size},
                )
                result = child.wait_event("result", 900)
                child.terminate()
            per_msg.setdefault(size, result["bytes_per_in_flight"])
            rss.append(result)
    return {
        "method": (
            "the pure tracker state object driven in a fresh child process; RSS is "
            "/proc/self/status VmRSS after minus before feeding N encoded START markers "
            "(fresh 32-hex-digit ids, 4 queue partitions, 30 s lease)"
        ),
        "core": core_result,
        "rss": rss,
    }
