"""bench/results/<name>.json and the Markdown table, with targets judged."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import JSON, ratio

RESULTS_DIR = Path(__file__).resolve().parent / "results"

TARGET_E2E_RATIO = 0.6
"""Issue #10's target; the long-term goal stays at 0.8x."""
TARGET_CPU_RATIO = 2.0
TARGET_OVERHEAD_BYTES = 200
TARGET_BATCH_ACK_VS_WAIT_FALSE = 0.5
TARGET_SYNC_SEND_RATIO = 0.8
TARGET_P95_RATIO = 2.0
TARGET_REDELIVERY_P99_BEYOND_LEASE_MS = 500.0
TARGET_CORE_EVENTS_PER_S = 200_000
TARGET_BYTES_PER_IN_FLIGHT = 300
TARGET_PROXY_RATIO = 0.5
"""Issue #13: kmq serve's throughput beside the SDK's, receiving in batches of 10."""
PAYLOAD_INDEPENDENCE_BYTES = 64
"""'Independent of payload size': 10 KB payloads cost at most this much more per message."""


def _n(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f} ms"


def _load(avg: list[float] | None) -> str:
    return "—" if not avg else "/".join(f"{v:.1f}" for v in avg)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return [*out, ""]


# -- targets ----------------------------------------------------------------------------


def targets(results: JSON) -> list[JSON]:
    """Each target (issues #4 and #10) with what this run measured; ``met`` is None if not
    measured."""
    sections = results.get("sections", {})
    out: list[JSON] = []

    def add(name: str, measured: str, met: bool | None) -> None:
        out.append({"target": name, "measured": measured, "met": met})

    e2e = sections.get("e2e")
    for queues in (1, 16):
        row = next((r for r in (e2e or {}).get("rows", []) if r["queues"] == queues), None)
        value = row["ratio"] if row else None
        add(
            f"e2e kmq >= {TARGET_E2E_RATIO}x raw, tracker running, {queues} queue(s)",
            _x(value),
            None if value is None else value >= TARGET_E2E_RATIO,
        )
    for queues in (1, 16):
        row = next((r for r in (e2e or {}).get("rows", []) if r["queues"] == queues), None)
        cpu = None
        if row:
            raw_cpu = sum(row["raw"]["cpu_us_per_msg"].values())
            cpu = sum(row["kmq"]["cpu_us_per_msg"].values()) / raw_cpu if raw_cpu else None
        add(
            f"total CPU per acked message <= {TARGET_CPU_RATIO:g}x raw, {queues} queue(s)",
            _x(cpu),
            None if cpu is None else cpu <= TARGET_CPU_RATIO,
        )
    for size in (100, 10_240):
        found = next(
            (
                r
                for r in (e2e or {}).get("bytes_written", [])
                if r["side"] == "kmq" and r["payload_bytes"] == size
            ),
            None,
        )
        overhead = found["overhead_per_message"] if found else None
        add(
            f"bytes written per message <= payload + {TARGET_OVERHEAD_BYTES} B ({size:,} B)",
            "—" if overhead is None else f"payload + {_n(overhead)} B",
            None if overhead is None else overhead <= TARGET_OVERHEAD_BYTES,
        )
    batch = next(
        (r for r in (e2e or {}).get("ack_wait", []) if r.get("variant", "").startswith("rec")),
        None,
    )
    value = batch["vs_wait_false"] if batch else None
    add(
        f"receive_many + durable ack_many >= {TARGET_BATCH_ACK_VS_WAIT_FALSE:g}x "
        "ack(wait=False), one thread",
        _x(value),
        None if value is None else value >= TARGET_BATCH_ACK_VS_WAIT_FALSE,
    )
    producer = sections.get("producer")
    sync = next(
        (r for r in (producer or {}).get("rows", []) if r["mode"] == "sync" and r["size"] == 256),
        None,
    )
    value = sync["ratio"] if sync else None
    add(
        f"synchronous send() >= {TARGET_SYNC_SEND_RATIO:g}x raw send().get() (256 B)",
        _x(value),
        None if value is None else value >= TARGET_SYNC_SEND_RATIO,
    )
    backlog = sections.get("backlog")
    p99 = backlog["delay_beyond_lease_ms"].get("p99") if backlog else None
    add(
        "redelivered copy behind a 10,000-message backlog within lease + 2 s (p99)",
        "—" if p99 is None else f"lease + {_n(p99)} ms",
        None if p99 is None else p99 <= backlog["target_beyond_lease_ms"]
        and backlog["never_redelivered"] == 0,
    )
    proxy = sections.get("proxy")
    value = proxy.get("throughput_ratio") if proxy else None
    limit = (proxy or {}).get("target_throughput_ratio", TARGET_PROXY_RATIO)
    add(
        f"HTTP proxy >= {limit:g}x the SDK's direct throughput, receiving in batches of 10",
        _x(value) if proxy is None or "skipped" not in proxy else f"skipped: {proxy['skipped']}",
        None if value is None else value >= limit,
    )
    latency = sections.get("latency")
    value = latency["ratio_send_to_receive"]["p95"] if latency else None
    add(
        f"kmq p95 send->receive <= {TARGET_P95_RATIO:g}x raw p95 at 50% load",
        _x(value),
        None if value is None else value <= TARGET_P95_RATIO,
    )
    redelivery = sections.get("redelivery")
    for row in (redelivery or {}).get("rows", []):
        p99 = row["paced"]["delay_beyond_lease_ms"]["p99"]
        complete = row["paced"]["never_redelivered"] == 0
        add(
            f"redelivery p99 <= lease + 0.5 s ({row['drop_pct']}% dropped)",
            f"lease + {_n(p99)} ms" + ("" if complete else " (some never redelivered)"),
            None if p99 is None else p99 <= TARGET_REDELIVERY_P99_BEYOND_LEASE_MS and complete,
        )
    if not redelivery:
        add("redelivery p99 <= lease + 0.5 s", "—", None)
    core = sections.get("tracker_core")
    value = core["core"]["events_per_s_median"] if core else None
    batched = (core or {}).get("core", {}).get("batched")
    label = "one marker per record"
    if batched:
        value, label = (
            batched["events_per_s_median"],
            (f"{batched['markers_per_record']} markers per BATCH record, as consumers write them"),
        )
    add(
        f"tracker core >= {TARGET_CORE_EVENTS_PER_S:,} marker events/s on one core",
        f"{_n(value)} /s ({label})",
        None if value is None else value >= TARGET_CORE_EVENTS_PER_S,
    )
    rss = (core or {}).get("rss", [])
    if rss:
        worst = max(r["bytes_per_in_flight"] for r in rss)
        add(
            f"tracker memory <= {TARGET_BYTES_PER_IN_FLIGHT} B per in-flight message",
            f"up to {_n(worst)} B",
            worst <= TARGET_BYTES_PER_IN_FLIGHT,
        )
        # Payload against payload at the same count: across counts RSS per message moves
        # by itself (allocator pools), which says nothing about payloads.
        small = {r["count"]: r["bytes_per_in_flight"] for r in rss if r["payload_bytes"] == 100}
        large = [(r["count"], r["bytes_per_in_flight"]) for r in rss if r["payload_bytes"] > 100]
        pairs = [size - small[count] for count, size in large if count in small]
        if pairs:
            growth = max(pairs)
            add(
                "tracker memory independent of payload size (10 KB vs 100 B)",
                f"{growth:+,.0f} B per message",
                growth <= PAYLOAD_INDEPENDENCE_BYTES,
            )
    else:
        add(
            f"tracker memory <= {TARGET_BYTES_PER_IN_FLIGHT} B per in-flight message",
            "—",
            None,
        )
    return out


# -- Markdown ---------------------------------------------------------------------------


def _e2e(section: JSON) -> list[str]:
    s = section["settings"]
    lines = [
        "## 1. End-to-end throughput",
        "",
        f"{s['payload_bytes']}-byte messages, {s['partitions']} partitions, acked msgs/s "
        f"(median of {s['repeats']}). kmq: `{s['ack']}`, max_in_flight {s['max_in_flight']}, "
        f"tracker process running. Raw: {s['raw_topology']}, commit after every poll. kmq: "
        f"{s['kmq_topology']}.",
        "",
    ]
    rows = [
        [
            str(r["queues"]),
            _n(r["messages"]),
            _n(r["raw"]["acked_per_s"]),
            _n(r["kmq"]["acked_per_s"]),
            _x(r["ratio"]),
        ]
        for r in section["rows"]
    ]
    for r in section.get("ack_wait", []):
        variant = r.get("variant", "ack(wait=True)")
        rows.append(
            [
                f"{r['queues']} (kmq `{variant}`)",
                _n(r["messages"]),
                _n(r["raw_acked_per_s"]),
                _n(r["kmq"]["acked_per_s"]),
                _x(r["ratio"]),
            ]
        )
    lines += _table(["queues", "messages", "raw msgs/s", "kmq msgs/s", "kmq/raw"], rows)
    lines += [
        "CPU time per acked message (µs, user + system, each process; 2 cores are shared by "
        "all of them, so their sum bounds throughput):",
        "",
    ]
    cpu_rows = []
    for r in section["rows"]:
        raw_cpu, kmq_cpu = r["raw"]["cpu_us_per_msg"], r["kmq"]["cpu_us_per_msg"]
        cpu_rows.append(
            [str(r["queues"])]
            + [
                f"{_n(raw_cpu.get(k))} / {_n(kmq_cpu.get(k))}"
                for k in ("producer", "consumer", "broker")
            ]
            + [
                _n(kmq_cpu.get("tracker")),
                f"{_n(sum(raw_cpu.values()))} / {_n(sum(kmq_cpu.values()))}",
            ]
        )
    lines += _table(
        [
            "queues",
            "producer raw / kmq",
            "consumer raw / kmq",
            "broker raw / kmq",
            "kmq tracker",
            "total raw / kmq",
        ],
        cpu_rows,
    )
    sizes = section.get("bytes_written") or []
    if sizes:
        lines += [
            "Bytes written to the broker per message: every record of the run's topics read "
            "back and sized as the record format stores it (key, value, headers, per-record "
            "varints; record-batch headers and offset commits not counted). kmq: queue "
            "records, markers and tracker copies; raw: the records.",
            "",
        ]
        by: dict[int, dict[str, JSON]] = {}
        for r in sizes:
            by.setdefault(r["payload_bytes"], {})[r["side"]] = r
        size_rows = []
        for size, pair in sorted(by.items()):
            raw, kmq = pair.get("raw"), pair.get("kmq")
            size_rows.append(
                [
                    f"{size:,} B",
                    _n(raw["per_message"]) if raw else "—",
                    _n(kmq["per_message"]) if kmq else "—",
                    f"payload + {_n(kmq['overhead_per_message'])} B" if kmq else "—",
                    _x(kmq["per_message"] / raw["per_message"]) if raw and kmq else "—",
                ]
            )
        lines += _table(
            ["payload", "raw bytes/msg", "kmq bytes/msg", "kmq overhead", "kmq/raw"], size_rows
        )
    return lines


def _latency(section: JSON) -> list[str]:
    raw, kmq = section["raw"], section["kmq"]
    lines = [
        "## 2. Latency at 50% of each side's max throughput (1 queue)",
        "",
        f"Offered load: raw {_n(raw['offered_per_s'])} msgs/s, kmq {_n(kmq['offered_per_s'])} "
        f"msgs/s, {section['settings']['seconds']:g} s each. receive->END visible: "
        f"{section['settings']['end_visible']}.",
        "",
    ]
    rows = []
    for p in ("p50", "p95", "p99"):
        rows.append(
            [
                f"send->receive {p}",
                _ms(raw["send_to_receive_ms"][p]),
                _ms(kmq["send_to_receive_ms"][p]),
                _x(section["ratio_send_to_receive"][p]),
            ]
        )
    for p in ("p50", "p95", "p99"):
        rows.append(
            [
                f"receive->ack visible to tracker {p} (raw: send->receive)",
                _ms(raw["send_to_receive_ms"][p]),
                _ms(kmq["recv_to_end_visible_ms"][p]),
                _x(section["ratio_recv_to_end_visible"][p]),
            ]
        )
    lines += _table(["metric", "raw", "kmq", "kmq/raw"], rows)
    same = section.get("raw_at_kmq_load")
    if same:
        s = same["send_to_receive_ms"]
        lines += [
            f"Raw at kmq's offered load ({_n(same['offered_per_s'])} msgs/s): send->receive "
            f"p50 {_ms(s['p50'])}, p95 {_ms(s['p95'])}, p99 {_ms(s['p99'])}.",
            "",
        ]
    return lines


def _redelivery(section: JSON) -> list[str]:
    base = section["baseline"]
    lines = [
        f"## 3. Redelivery (lease {section['settings']['lease_s']:g} s)",
        "",
        f"Dropped: {section['settings']['drop']}. Delay: {section['settings']['delay']}. "
        f"Throughput: {section['settings']['throughput']}. Baselines: raw "
        f"{_n(base['raw_acked_per_s'])} msgs/s, kmq without drops "
        f"{_n(base['kmq_acked_per_s_no_drops'])} msgs/s.",
        "",
    ]
    rows = []
    for r in section["rows"]:
        paced, unpaced = r["paced"], r["unpaced"] or {}
        d = paced["delay_beyond_lease_ms"]
        rows.append(
            [
                f"{r['drop_pct']}%",
                f"{paced['redelivered']}/{paced['dropped']}",
                _ms(d["p50"]),
                _ms(d["p99"]),
                _ms(d["max"]),
                _n(base["raw_acked_per_s"]),
                _n(unpaced.get("acked_per_s_main_flow")),
                _x(unpaced.get("ratio_main_flow_vs_raw")),
                _n(unpaced.get("acked_per_s_all_in")),
                _x(unpaced.get("ratio_all_in_vs_raw")),
            ]
        )
    lines += _table(
        [
            "dropped",
            "redelivered",
            "delay beyond lease p50",
            "p99",
            "max",
            "raw msgs/s",
            "kmq main flow msgs/s",
            "kmq/raw",
            "kmq all in msgs/s",
            "kmq/raw",
        ],
        rows,
    )
    parts = [
        [
            f"{r['drop_pct']}%",
            *(
                _ms((r["paced"].get(key) or {}).get(q))
                for key in ("copy_written_beyond_lease_ms", "copy_taken_after_written_ms")
                for q in ("p50", "p99")
            ),
        ]
        for r in section["rows"]
        if r["paced"].get("copy_written_beyond_lease_ms")
    ]
    if parts:
        lines += [f"The delay's parts, {section['settings']['parts']}:", ""]
        lines += _table(
            [
                "dropped",
                "tracker part p50",
                "p99",
                "consumer part p50",
                "p99",
            ],
            parts,
        )
    return lines


def _tracker_core(section: JSON) -> list[str]:
    core = section["core"]
    lines = [
        "## 4. Tracker core",
        "",
        f"Pure `PartitionState.on_record` (protobuf decode included), START/KEEPALIVE/END in "
        f"equal shares, {core['window']:,} in flight, {core['events']:,} events, one core: "
        f"**{_n(core['events_per_s_median'])} events/s** (median of "
        f"{len(core['events_per_s'])}; best {_n(core['events_per_s_best'])}). Decode alone: "
        f"{_n(core['decode_only_per_s'])} markers/s. No raw baseline: raw Kafka has no tracker.",
        "",
        *(
            [
                f"The same stream as BATCH records of {b['markers_per_record']} markers "
                f"({b['records']:,} records): **{_n(b['events_per_s_median'])} marker events/s** "
                f"(median; best {_n(b['events_per_s_best'])}).",
                "",
            ]
            if (b := core.get("batched"))
            else []
        ),
        f"State: `{core.get('state', 'PartitionState()')}`. Memory: {section['method']}.",
        "",
    ]
    rows = []
    for r in section["rss"]:
        rows.append(
            [
                _n(r["count"]),
                f"{r['payload_bytes']:,} B",
                _n(r["bytes_per_in_flight"]),
                "skipped: projected "
                f"{r['projected_gib']:.1f} GiB (> 40% of free RAM); bytes/msg extrapolated"
                if r.get("skipped")
                else f"{r['rss_after_mib']:,.0f} MiB",
            ]
        )
    lines += _table(["in flight", "payload", "RSS bytes per in-flight msg", "RSS after"], rows)
    return lines


def _producer(section: JSON) -> list[str]:
    s = section["settings"]
    lines = [
        "## 5. Producer",
        "",
        f"{s['producer']}. Sync: {s['sync']} ({s['sync_count']:,} sends). "
        f"Sync from threads: {s.get('sync_threads', '—')}. Async: {s['async']} "
        f"(up to {s['async_count']:,} sends or {s.get('async_bytes', 0) / 1e6:g} MB of payload, "
        "at least 1,000).",
        "",
    ]
    rows = [
        [
            f"{r['size']:,} B",
            r["mode"],
            _n(r["raw"]["count"]),
            _n(r["raw"]["msgs_per_s"]),
            _n(r["raw"]["mb_per_s"], 1),
            _n(r["kmq"]["msgs_per_s"]),
            _n(r["kmq"]["mb_per_s"], 1),
            _x(r["ratio"]),
        ]
        for r in section["rows"]
    ]
    lines += _table(
        [
            "payload",
            "mode",
            "sends",
            "raw msgs/s",
            "raw MB/s",
            "kmq msgs/s",
            "kmq MB/s",
            "kmq/raw",
        ],
        rows,
    )
    return lines


def _profile(section: JSON) -> list[str]:
    settings = section.get("settings", {})
    queues, messages = settings.get("queues", 1), settings.get("messages")
    size = f", {messages:,} messages" if messages else ""
    lines = [f"## Profile (py-spy, {queues} queue(s){size}, unpaced)", ""]
    roles = (
        ("kmq", "consumer"), ("kmq", "tracker"), ("kmq", "producer"),
        ("raw", "consumer"), ("raw", "producer"),
    )  # fmt: skip
    for side, role in roles:
        data = section.get(side, {}).get(role)
        if not data:
            continue
        lines.append(
            f"**{side} {role}** ({data['samples']} samples, "
            f"{data['idle_self_share']:.0%} idle/waiting). Threads: "
            + ", ".join(f"{t['function']} {t['share']:.0%}" for t in data["threads"][:4])
        )
        lines.append("")
        rows = [[f"{r['share']:.1%}", f"`{r['function']}`"] for r in data["self"][:10]]
        lines += _table(["self", "function"], rows)
        if data["kmq_inclusive"]:
            rows = [[f"{r['share']:.1%}", f"`{r['function']}`"] for r in data["kmq_inclusive"][:8]]
            lines += _table(["inclusive", "kmq/tracker function"], rows)
    return lines


def _transactional(section: JSON) -> list[str]:
    lines = ["## 6. Transactional modes", ""]
    if not section.get("rows"):
        return [
            *lines,
            f"Not measured: {section.get('note', 'no transactional mode')}.",
            "",
        ]
    base = section["baseline"]
    lines += [
        "Transactional consumer (a batch's STARTs and its offset commit in one transaction), "
        "1 queue, 100-byte messages, `ack(wait=False)` (the tracker's rounds are fenced "
        "transactions in every mode). Baselines from section 1: "
        f"raw {_n(base['raw_acked_per_s'])} msgs/s, kmq (not transactional) "
        f"{_n(base['kmq_acked_per_s'])} msgs/s.",
        "",
    ]
    rows = [
        [
            r["variant"],
            _n(r["messages"]),
            _n(base["raw_acked_per_s"]),
            _n(r["acked_per_s"]),
            _x(r["ratio_vs_raw"]),
            _x(r["ratio_vs_kmq_default"]),
            _n(r["cpu_us_per_msg"].get("consumer")),
        ]
        for r in section["rows"]
    ]
    lines += _table(
        [
            "kmq variant",
            "messages",
            "raw msgs/s",
            "kmq msgs/s",
            "kmq/raw",
            "vs kmq default",
            "consumer CPU µs/msg",
        ],
        rows,
    )
    red = section.get("redelivery_10pct")
    if red:
        d = red["delay_beyond_lease_ms"]
        lines += [
            f"Redelivery, 10% dropped, lease {red['lease_s']:g} s, "
            f"{_n(red['offered_per_s'])} msgs/s offered: {red['redelivered']}/{red['dropped']} "
            f"redelivered, delay beyond lease p50 {_ms(d['p50'])}, p99 {_ms(d['p99'])}.",
            "",
        ]
    lat = section.get("latency")
    if lat:
        s2r, vis = lat["send_to_receive_ms"], lat["recv_to_end_visible_ms"]
        lines += [
            f"Latency at {_n(lat['offered_per_s'])} msgs/s: send->receive p50 {_ms(s2r['p50'])}, "
            f"p95 {_ms(s2r['p95'])}, p99 {_ms(s2r['p99'])}; receive->END visible p50 "
            f"{_ms(vis['p50'])}, p95 {_ms(vis['p95'])}, p99 {_ms(vis['p99'])}.",
            "",
        ]
    return lines


def _backlog(section: JSON) -> list[str]:
    s = section["settings"]
    d = section["delay_beyond_lease_ms"]
    n = section.get("nack_to_copy_ms") or {}
    return [
        "## 7. Redelivery behind a standing backlog (retry lane)",
        "",
        f"{s['backlog']}; lease {s['lease_s']:g} s. 1% of first deliveries abandoned (as a "
        "crash would), 1% nacked with no delay. Copies go to the retry topic, which "
        "consumers read before the queue topic. No raw baseline: raw Kafka does not "
        "redeliver.",
        "",
        *_table(
            ["copies of", "count", "p50", "p99", "max", "target"],
            [
                [
                    "abandoned (delay beyond the lease)",
                    f"{_n(d.get('n'))} of {_n(section['dropped'])}",
                    _ms(d.get("p50")),
                    _ms(d.get("p99")),
                    _ms(d.get("max")),
                    f"<= {_n(section['target_beyond_lease_ms'])} ms",
                ],
                [
                    "nacked (nack to copy received)",
                    f"{_n(n.get('n'))} of {_n(section.get('nacked'))}",
                    _ms(n.get("p50")),
                    _ms(n.get("p99")),
                    _ms(n.get("max")),
                    "—",
                ],
            ],
        ),
    ]


def _proxy(section: JSON) -> list[str]:
    lines = ["## 8. HTTP proxy (`kmq serve`) beside the SDK", ""]
    if "skipped" in section:
        return [*lines, f"Not measured: {section['skipped']}.", ""]
    s = section["settings"]
    unpaced, paced = section["unpaced"], section["paced"]
    lines += [
        f"{s['payload_bytes']}-byte messages, 1 queue over {s['partitions']} partitions, "
        f"tracker process running, each side with fresh topics. Proxy: {s['proxy']}. "
        f"Direct: {s['direct']}. Throughput: acked msgs/s over first send -> last ack, "
        f"{s['messages']:,} messages, unpaced. Latency: send->receive (monotonic clock "
        f"stamped in the payload), {s['paced_messages']:,} messages at "
        f"{_n(s['paced_rate'])} msgs/s offered to both sides ({s['paced_load']:.0%} of the "
        "slower side's throughput), first 5% left out.",
        "",
    ]

    def lat(run: JSON, p: str) -> str:
        return _ms(run["latency_ms"].get(p))

    rows = [
        [
            "acked msgs/s (unpaced)",
            _n(unpaced["proxy"]["acked_per_s"]),
            _n(unpaced["direct"]["acked_per_s"]),
            _x(section["throughput_ratio"]),
        ],
        [
            "sent msgs/s (unpaced, durable batches)",
            _n(unpaced["proxy"]["send_per_s"]),
            _n(unpaced["direct"]["send_per_s"]),
            _x(ratio(unpaced["proxy"]["send_per_s"], unpaced["direct"]["send_per_s"])),
        ],
        [
            f"send->receive p50 at {_n(s['paced_rate'])} msgs/s",
            lat(paced["proxy"], "p50"),
            lat(paced["direct"], "p50"),
            _x(section.get("p50_ratio")),
        ],
        [
            f"send->receive p95 at {_n(s['paced_rate'])} msgs/s",
            lat(paced["proxy"], "p95"),
            lat(paced["direct"], "p95"),
            _x(section["p95_ratio"]),
        ],
        [
            "send->receive p95 unpaced (backlog included)",
            lat(unpaced["proxy"], "p95"),
            lat(unpaced["direct"], "p95"),
            _x(
                ratio(
                    unpaced["proxy"]["latency_ms"].get("p95"),
                    unpaced["direct"]["latency_ms"].get("p95"),
                )
            ),
        ],
        [
            f"batch send round trip p50 / p95 (batch of {s['batch']}, unpaced)",
            _pair(unpaced["proxy"]["sent"]["batch_round_trip_ms"]),
            _pair(unpaced["direct"]["sent"]["batch_round_trip_ms"]),
            "—",
        ],
    ]
    lines += _table(["metric", "proxy", "direct (SDK)", "proxy/direct"], rows)
    pcpu, dcpu = unpaced["proxy"]["cpu_us_per_msg"], unpaced["direct"]["cpu_us_per_msg"]
    cpu_rows = [
        [
            name,
            _n(pcpu.get(name)),
            _n(dcpu.get(name)),
        ]
        for name in ("sender", "receiver", "proxy", "tracker", "broker")
    ]
    cpu_rows.append(["total", _n(sum(pcpu.values())), _n(sum(dcpu.values()))])
    lines += [
        "CPU time per acked message, unpaced (µs, user + system; receiver: the HTTP "
        "clients' process, or the SDK consumer's):",
        "",
        *_table(["process", "proxy", "direct (SDK)"], cpu_rows),
    ]
    received = unpaced["proxy"]["received"]
    lines += [
        f"Proxy receives (unpaced): {_n(received.get('receives'))}, of which "
        f"{_n(received.get('empty_receives'))} empty; "
        f"{_n(received.get('messages_per_receive'), 1)} messages per non-empty receive. "
        f"Goal proxy >= {section['target_throughput_ratio']:g}x direct throughput: "
        f"{'**met**' if section['goal_met'] else 'not met'}.",
        "",
    ]
    return lines


def _pair(summary: JSON) -> str:
    return f"{_ms(summary.get('p50'))} / {_ms(summary.get('p95'))}"


SECTIONS: list[tuple[str, Callable[[JSON], list[str]]]] = [
    ("e2e", _e2e),
    ("latency", _latency),
    ("redelivery", _redelivery),
    ("tracker_core", _tracker_core),
    ("producer", _producer),
    ("transactional", _transactional),
    ("backlog", _backlog),
    ("proxy", _proxy),
    ("profile", _profile),
]


def markdown(results: JSON) -> str:
    hw = results["hardware"]
    lines = [
        f"# kmq benchmark: {results['name']}",
        "",
        f"{results['started']}, {results['mode']} run, {results['seconds']:.0f} s. Broker: "
        f"{results['broker']}. Hardware: {hw['nproc']} CPUs ({hw['cpu']}), {hw['ram_gib']} GiB "
        f"RAM, Linux {hw['kernel']}; Python {hw['python']}, kafka-python {hw['kafka_python']}. "
        "Producer, consumer, tracker and broker each run in their own process on this one "
        "machine, over loopback. Load average (1/5/15 min) at start "
        f"{_load(results.get('loadavg_start'))}, at end {_load(results.get('loadavg_end'))}.",
        "",
    ]
    code = results.get("code", {})
    if code.get("changed_during_run"):
        lines += [
            "**Warning: kmq/ or tracker/ changed while this run was going on; sections ran "
            "against different code.**",
            "",
        ]
    sections = results["sections"]
    for name, render in SECTIONS:
        if name in sections:
            lines += render(sections[name])
    if "transactional" not in sections:
        lines += ["## 6. Transactional modes", "", "Not measured in this run.", ""]
    for name, error in results.get("errors", {}).items():
        lines += [f"**Section {name} failed:** `{error}`", ""]
    lines += ["## Targets", ""]
    rows = [
        [
            t["target"],
            t["measured"],
            "not measured" if t["met"] is None else ("**met**" if t["met"] else "not met"),
        ]
        for t in results["targets"]
    ]
    lines += _table(["target", "measured", "status"], rows)
    return "\n".join(lines)


def write(results: JSON, name: str, directory: Path = RESULTS_DIR) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    results["targets"] = targets(results)
    json_path, md_path = directory / f"{name}.json", directory / f"{name}.md"
    for path, text in (
        (json_path, json.dumps(results, indent=2, default=str) + "\n"),
        (md_path, markdown(results)),
    ):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return json_path, md_path
