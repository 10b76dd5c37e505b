"""``report.html``: one self-contained page (plots as embedded PNGs) rendered from the summary."""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from kmq.audit.summary import METRICS
from kmq.audit.transforms import STATUSES

COLORS = {
    "acked": "#2e7d32",
    "dead_lettered": "#6a1b9a",
    "in_flight": "#1565c0",
    "pending": "#9e9e9e",
    "awaiting_redelivery": "#ef6c00",
    "lost": "#c62828",
    "lease_expired": "#c62828",
    "nacked": "#ef6c00",
    "released": "#1565c0",
    "sent": "#455a64",
}
METRIC_LABELS = {
    "processing_ms": "processing (START → END)",
    "queue_wait_ms": "queue wait (send → START)",
    "end_to_end_ms": "end to end (send → first END)",
}
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1120px;color:#212121;padding:0 16px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#616161;font-size:13px}.verdict{display:inline-block;padding:6px 12px;border-radius:4px;
color:#fff;font-weight:600;margin:12px 8px 4px 0}.good{background:#2e7d32}.bad{background:#c62828}
.warn{background:#ef6c00}.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.tile{border:1px solid #e0e0e0;border-radius:6px;padding:8px 14px;min-width:92px}
.tile b{display:block;font-size:22px}.tile span{color:#616161;font-size:12px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border-bottom:1px solid #eee;padding:3px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}img{max-width:100%}code{font-size:12px}
"""


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="" src="data:image/png;base64,{data}">'


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def outcome_figure(queues: Mapping[str, Mapping[str, Any]]) -> Figure:
    """Each queue's sent messages by status, as one stacked bar per queue."""
    names = sorted(queues)
    fig = Figure(figsize=(11, 0.6 + 0.45 * max(1, len(names))))
    ax = fig.subplots()
    left = [0.0] * len(names)
    for status in STATUSES:
        values = [float(queues[q][status]) for q in names]
        ax.barh(names, values, left=left, color=COLORS[status], label=status.replace("_", " "))
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("messages sent")
    ax.legend(ncols=len(STATUSES), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


def latency_figure(
    histogram: Mapping[str, Sequence[Sequence[float]]], overall: Mapping[str, Any]
) -> Figure:
    """The distribution of each latency, on a log scale, with its p50 and p99 marked."""
    fig = Figure(figsize=(11, 3.2))
    axes = fig.subplots(1, len(METRICS))
    for ax, metric in zip(axes, METRICS, strict=True):
        points = histogram.get(metric, [])
        stats = overall["latency_ms"][metric]
        ax.set_title(METRIC_LABELS[metric], fontsize=10)
        if not points:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        lows = [max(p[0], 0.5) for p in points]
        ax.bar(
            lows,
            [p[1] for p in points],
            width=[x * 0.25 for x in lows],
            align="edge",
            color="#1565c0",
        )
        ax.set_xscale("log")
        for q, style in (("p50", "--"), ("p99", ":")):
            if stats[q] is not None:
                ax.axvline(max(stats[q], 0.5), color="#c62828", linestyle=style, label=q)
        ax.set_xlabel("ms")
        ax.legend(frameon=False, fontsize=8)
    axes[0].set_ylabel("count")
    fig.tight_layout()
    return fig


def activity_figure(activity: Mapping[str, Any]) -> Figure:
    """Sent and acked per time bucket (top), redeliveries by cause (bottom)."""
    bucket_s = activity["bucket_ms"] / 1000
    series: Mapping[str, Sequence[Sequence[int]]] = activity["series"]
    fig = Figure(figsize=(11, 4.6))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 1))

    def times(points: Sequence[Sequence[int]]) -> list[dt.datetime]:
        return [dt.datetime.fromtimestamp(p[0] / 1000, dt.UTC) for p in points]

    for name in ("sent", "acked"):
        points = series.get(name, [])
        if points:
            top.step(times(points), [p[1] for p in points], where="post", label=name,
                     color=COLORS[name if name == "sent" else "acked"])  # fmt: skip
    top.set_ylabel(f"messages / {bucket_s:g} s")
    if series.get("sent") or series.get("acked"):
        top.legend(frameon=False, fontsize=8)
    top.grid(alpha=0.3)
    width = dt.timedelta(seconds=bucket_s)
    totals: dict[int, int] = {}
    for cause in ("lease_expired", "nacked", "released"):
        points = series.get(f"redelivered_{cause}", [])
        if not points:
            continue
        base = [totals.get(p[0], 0) for p in points]
        bottom.bar(times(points), [p[1] for p in points], width=width, bottom=base,
                   align="edge", color=COLORS[cause], label=cause.replace("_", " "))  # fmt: skip
        for p in points:
            totals[p[0]] = totals.get(p[0], 0) + p[1]
    if not totals:
        bottom.text(0.5, 0.5, "no redeliveries", ha="center", va="center",
                    transform=bottom.transAxes)  # fmt: skip
    else:
        bottom.legend(frameon=False, fontsize=8)
    bottom.set_ylabel(f"redeliveries / {bucket_s:g} s")
    bottom.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def attempts_figure(overall: Mapping[str, Any]) -> Figure:
    """Messages by highest attempt, and redeliveries by cause."""
    fig = Figure(figsize=(11, 2.8))
    left, right = fig.subplots(1, 2)
    attempts = overall["attempts"]
    left.bar([str(k) for k in attempts], list(attempts.values()), color="#455a64")
    left.set_xlabel("highest attempt started")
    left.set_ylabel("messages")
    left.set_yscale("log" if attempts and max(attempts.values()) > 1000 else "linear")
    causes = overall["redelivery_causes"]
    names = list(causes) or ["none"]
    right.barh(names, [causes.get(n, 0) for n in names],
               color=[COLORS.get(n, "#9e9e9e") for n in names])  # fmt: skip
    right.set_xlabel("redeliveries by cause")
    fig.tight_layout()
    return fig


def _tiles(overall: Mapping[str, Any]) -> str:
    tiles = [
        ("sent", "sent"),
        ("acked", "acked"),
        ("dead_lettered", "dead-lettered"),
        ("in_flight", "in flight"),
        ("in_flight_overdue", "in flight, lease over"),
        ("pending", "pending"),
        ("awaiting_redelivery", "awaiting redelivery"),
        ("lost", "lost"),
        ("redelivered", "redeliveries"),
        ("duplicate_deliveries", "duplicate deliveries"),
    ]
    return "".join(
        f'<div class="tile"><b>{_num(overall[k])}</b><span>{label}</span></div>'
        for k, label in tiles
    )


def _queue_table(summary: Mapping[str, Any]) -> str:
    cols = [
        "sent",
        "acked",
        "dead_lettered",
        "in_flight",
        "pending",
        "awaiting_redelivery",
        "lost",
        "delivered",
        "redelivered",
        "duplicate_deliveries",
    ]
    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in cols)
    lat = "<th>processing p50 / p99 ms</th><th>queue wait p50 / p99 ms</th>"
    rows = []
    entries = [*summary["queues"].items(), ("all queues", summary["overall"])]
    for name, entry in entries:
        cells = "".join(f"<td>{_num(entry[c])}</td>" for c in cols)
        lats = "".join(
            f"<td>{_num(entry['latency_ms'][m]['p50'])} / {_num(entry['latency_ms'][m]['p99'])}"
            "</td>"
            for m in ("processing_ms", "queue_wait_ms")
        )
        label = f"<b>{html.escape(name)}</b>" if name == "all queues" else html.escape(name)
        rows.append(f"<tr><td>{label}</td>{cells}{lats}</tr>")
    return f"<table><tr><th>queue</th>{head}{lat}</tr>{''.join(rows)}</table>"


def _samples(summary: Mapping[str, Any]) -> str:
    parts = []
    for status, rows in summary["samples"].items():
        if not rows:
            continue
        total = summary["overall"][status]
        body = "".join(
            f"<tr><td><code>{html.escape(r['message_id'])}</code></td>"
            f"<td>{html.escape(r['queue'])}</td><td>{_num(r['latest_attempt'])}</td>"
            f"<td>{_when(r['since_ms'])}</td></tr>"
            for r in rows
        )
        parts.append(
            f"<h3>{status.replace('_', ' ')}: oldest {len(rows)} of {_num(total)}</h3>"
            "<table><tr><th>message id</th><th>queue</th><th>attempt</th><th>since</th></tr>"
            f"{body}</table>"
        )
    return "".join(parts) or "<p>None: every sent message was acked or dead-lettered.</p>"


def _verdict(summary: Mapping[str, Any]) -> str:
    overall = summary["overall"]
    if overall["lost"]:
        out = f'<span class="verdict bad">{_num(overall["lost"])} messages lost</span>'
    else:
        out = '<span class="verdict good">no message lost</span>'
    if summary["settled"]:
        out += '<span class="verdict good">settled: all acked or dead-lettered</span>'
    else:
        open_ = overall["sent"] - overall["acked"] - overall["dead_lettered"] - overall["lost"]
        out += f'<span class="verdict warn">{_num(open_)} messages not settled yet</span>'
    return out


def render_html(summary: Mapping[str, Any]) -> str:
    """The whole report page for ``summary`` (as built by :func:`build_summary`)."""
    snap = summary["snapshot"]
    overall = summary["overall"]
    series = summary["series"]
    reasons = "".join(
        f"<tr><td>{html.escape(r) or '(none)'}</td><td>{_num(n)}</td></tr>"
        for r, n in overall["redelivery_reasons"].items()
    )
    markers = "".join(
        f"<tr><td>{html.escape(t)}</td><td>{_num(n)}</td></tr>"
        for t, n in summary["markers"].items()
    )
    figures = {
        "outcomes": _png(outcome_figure(summary["queues"])) if summary["queues"] else "",
        "latency": _png(latency_figure(series["latency_histogram"], overall)),
        "activity": _png(activity_figure(series["activity"])),
        "attempts": _png(attempts_figure(overall)),
    }
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kmq audit {html.escape(snap["as_of"])}</title>
<style>{_CSS}</style></head><body>
<h1>kmq audit</h1>
<div class="meta">as of {html.escape(snap["as_of"])} &middot; queue topic
<code>{html.escape(snap["queue_topic"])}</code> ({_num(snap["queue_records"])} records) &middot;
markers topic <code>{html.escape(snap["marker_topic"])}</code>
({_num(snap["marker_records"])} markers) &middot; {html.escape(snap["bootstrap_servers"])}</div>
{_verdict(summary)}
<div class="tiles">{_tiles(overall)}</div>
<h2>Outcome per queue</h2>{figures["outcomes"]}
{_queue_table(summary)}
<h2>Latency</h2>{figures["latency"]}
<h2>Over time</h2>{figures["activity"]}
<h2>Attempts and redeliveries</h2>{figures["attempts"]}
<table><tr><th>redelivery reason (top)</th><th>redeliveries</th></tr>{reasons}</table>
<h2>Messages not settled</h2>{_samples(summary)}
<h2>Markers read</h2><table><tr><th>type</th><th>markers</th></tr>{markers}</table>
<p class="meta">Definitions: docs/audit.md. Machine-readable: summary.json
(schema {html.escape(summary["schema"])}).</p>
</body></html>
"""
