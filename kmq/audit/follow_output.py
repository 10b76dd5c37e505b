"""What ``kmq audit --follow`` writes on every refresh: summary.json, a self-refreshing
report.html and, optionally, Prometheus metrics in the text exposition format. Pure Python."""

from __future__ import annotations

import datetime as dt
import html
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA = "kmq.audit.follow/v1"
CURRENT = ("in_flight", "pending", "awaiting_redelivery", "lost", "acked", "dead_lettered")


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def render_html(summary: Mapping[str, Any], refresh_s: float) -> str:
    """A plain page that reloads itself every ``refresh_s`` seconds."""
    e = html.escape
    rows = []
    for queue, c in summary["current"].items():
        w = summary["window"].get(queue, {})
        lat = w.get("latency_ms", {}).get("processing_ms", {})
        cells = [queue, *(c.get(k, 0) for k in (*CURRENT, "stuck"))]
        cells += [w.get(k, 0) for k in ("sent", "acked", "redelivered")]
        cells += [lat.get("p50"), lat.get("p99")]
        rows.append("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in cells) + "</tr>")
    head = ["queue", *CURRENT, "stuck", "sent", "acked", "redelivered", "p50 ms", "p99 ms"]
    stuck = "".join(
        f"<tr><td>{e(s['queue'])}</td><td>{e(s['message_id'])}</td><td>{e(s['why'])}</td>"
        f"<td>{s['age_ms'] / 1000:.1f} s</td><td>{e(str(s['attempt']))}</td></tr>"
        for s in summary["stuck"][:200]
    )
    bad = ", ".join(f"{e(k)}={v}" for k, v in sorted(summary["bad_input"].items())) or "none"
    verdict = "bad" if summary["stuck"] else "good"
    text = f"{len(summary['stuck'])} stuck" if summary["stuck"] else "nothing stuck"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{max(1, round(refresh_s))}">
<title>kmq audit --follow</title>
<style>body{{font:14px system-ui,sans-serif;margin:24px}}td,th{{padding:2px 8px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}.good{{color:#2e7d32}}.bad{{color:#c62828}}</style>
</head><body>
<h1>kmq audit --follow</h1>
<p>as of {e(summary["as_of"])} · batch {summary["batch_id"]} · window {summary["window_s"]:g} s ·
<b class="{verdict}">{text}</b></p>
<h2>Queues (current statuses of messages in the state; the window's figures)</h2>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>{"".join(rows)}</table>
<h2>Stuck</h2>
<table><tr><th>queue</th><th>message</th><th>why</th><th>for</th><th>attempt</th></tr>{stuck}</table>
<h2>Bad input</h2><p>{bad}</p>
<p>state: {e(str(summary["state"]))}</p>
</body></html>
"""


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(summary: Mapping[str, Any]) -> str:
    """Gauges per queue, for node_exporter's textfile collector or any scraper."""
    lines: list[str] = []

    def gauge(name: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

    current = summary["current"]
    gauge(
        "kmq_audit_messages",
        "Messages in the follow state by current status.",
        [({"queue": q, "status": s}, c.get(s, 0)) for q, c in current.items() for s in CURRENT],
    )
    gauge(
        "kmq_audit_stuck_messages",
        "Messages in flight longer than N leases or never started after the bound.",
        [({"queue": q}, c.get("stuck", 0)) for q, c in current.items()],
    )
    window = summary["window"]
    gauge(
        "kmq_audit_window_events",
        "Events in the trailing window.",
        [
            ({"queue": q, "event": k}, w.get(k, 0))
            for q, w in window.items()
            for k in ("sent", "acked", "redelivered", "dead_lettered")
        ],
    )
    gauge(
        "kmq_audit_window_latency_ms",
        "Latency percentiles over the trailing window.",
        [
            ({"queue": q, "metric": m, "quantile": f"0.{p[1:]}"}, v[p])
            for q, w in window.items()
            for m, v in w["latency_ms"].items()
            for p in ("p50", "p90", "p99")
            if v.get(p) is not None
        ],
    )
    gauge(
        "kmq_audit_bad_input",
        "Undecodable, unknown or orphaned records seen since the query started.",
        [({"kind": k}, v) for k, v in sorted(summary["bad_input"].items())],
    )
    gauge("kmq_audit_last_refresh_ms", "When this was written.", [({}, summary["as_of_ms"])])
    return "\n".join(lines) + "\n"
