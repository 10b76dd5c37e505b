"""deploy/: the Grafana dashboard queries only metrics kmq exposes, and the Kubernetes
example sets only settings kmq-tracker reads and probes the paths it serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from kmq import metrics as sdk_metrics
from tracker.cli import main as tracker_main
from tracker.metrics import registry as tracker_registry
from tracker.state import PartitionState
from tracker.view import TrackerView, partition_view

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def exposed_names() -> set[str]:
    state = PartitionState(0)
    state.set_position(0)
    view = TrackerView(False, True, "", True, True, 0.0, (partition_view(state, 0.0),),
                       {"fenced": 1})  # fmt: skip
    names: set[str] = set()
    sdk = CollectorRegistry()
    queue = sdk_metrics.for_queue(sdk, "q")
    assert queue is not None
    queue.processing.observe(0.1)

    class Consumer:
        queue = "q"
        in_flight = 1

    watched = Consumer()
    queue.watch(watched)
    for reg in (tracker_registry(lambda: view), sdk):
        for family in reg.collect():
            names.update(sample.name for sample in family.samples)
    return names


def test_the_dashboard_queries_only_metrics_kmq_exposes() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"\bkmq_\w+", e)}
    assert len(used) >= 20
    assert used <= exposed_names(), used - exposed_names()


def test_the_kubernetes_example_uses_real_settings_and_probe_paths() -> None:
    text = (DEPLOY / "kubernetes-tracker.yaml").read_text()
    envvars = {p.envvar for p in tracker_main.params if isinstance(getattr(p, "envvar", None), str)}
    used = set(re.findall(r"name: (KMQ_\w+)", text))
    assert {"KMQ_METRICS_PORT", "KMQ_BOOTSTRAP_SERVERS", "KMQ_LOG_FORMAT"} <= used
    assert used <= envvars, used - envvars
    port = re.search(r"KMQ_METRICS_PORT, value: \"(\d+)\"", text)
    assert port is not None and f"containerPort: {port.group(1)}" in text
    assert "path: /healthz" in text and "path: /readyz" in text
