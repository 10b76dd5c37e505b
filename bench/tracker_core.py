"""Section 4: the tracker's pure state object — marker events per second on one core, and
memory per in-flight message. Each measurement runs in a fresh child process."""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import time
from typing import Any

from bench.common import JSON, Children, Context, median, mem_available_bytes

LEASE_MS = 30_000


def new_state(*, replaying: bool = False) -> Any:
    """A PartitionState as tracker.daemon builds it (it keeps no payloads), caught up on its
    partition as a tracker is between replays; with ``replaying``, one still replaying it,
    which also keeps the bookkeeping a replay takes over leases with (tracker.handover)."""
    from tracker.state import PartitionState

    state = PartitionState(0)
    if not replaying:
        state.set_position(0)
        state.set_end_offset(0)
    return state


def state_settings(*, replaying: bool = False) -> str:
    return (
        f"PartitionState(), as tracker.daemon builds it (marker protocol v2, no payloads), "
        f"{'replaying its partition' if replaying else 'caught up on its partition'}"
    )


def _marker(kind: Any, i: int) -> Any:
    from kmq.markers import Marker, MarkerType

    lease = LEASE_MS if kind is not MarkerType.END else 0
    return Marker(kind, partition=i % 4, offset=i // 4, attempt=1, redeliver_after_ms=lease)


def _stream(messages: int, window: int) -> list[Any]:
    """START, KEEPALIVE and END in equal shares, about ``window`` messages in flight: message
    i starts, message i - window/2 is kept alive and message i - window ends."""
    from kmq.markers import MarkerType

    half = window // 2
    markers: list[Any] = []
    for i in range(messages + window):
        if i < messages:
            markers.append(_marker(MarkerType.START, i))
        if half <= i < messages + half:
            markers.append(_marker(MarkerType.KEEPALIVE, i - half))
        if window <= i:
            markers.append(_marker(MarkerType.END, i - window))
    return markers


def marker_stream(messages: int, window: int, payload_bytes: int = 100) -> list[bytes]:
    """The stream, one marker per record. Markers carry no payload since protocol version 2:
    ``payload_bytes`` changes nothing (kept for the report's comparison)."""
    from kmq.markers import encode

    return [encode(m) for m in _stream(messages, window)]


def batched(messages: int, window: int, per_record: int) -> list[bytes] | None:
    """The same marker stream, ``per_record`` markers to a record, as kmq consumers write
    them."""
    from kmq.markers import encode_batch

    markers = _stream(messages, window)
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
    replaying = bool(a.get("replaying", False))
    state = new_state(replaying=replaying)
    now = 1000.0
    # Markers no longer carry payloads: "size" stays in the report to show that the state
    # does not depend on it. Warm up allocator pools and imports, then measure from here.
    for i in range(1000):
        state.on_record(i, encode(_marker(MarkerType.START, i)), now)
    gc.collect()
    before = _rss_bytes()
    start = time.perf_counter()
    for i in range(1000, 1000 + count):
        value = encode(
            Marker(MarkerType.START, i % 4, i // 4, attempt=1, redeliver_after_ms=LEASE_MS)
        )
        state.on_record(i, value, now + i * 1e-6)
    # Messages held longer than young_s: every START gets its lease (none is due yet).
    state.next_wake(now + (1000 + count) * 1e-6 + state.young_s)
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
        "state": state_settings(replaying=replaying),
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
