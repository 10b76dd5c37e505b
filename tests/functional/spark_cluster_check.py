"""The batch audit and the streaming source on ``local-cluster[2,1,1024]`` (a master, two
workers and two executor JVMs started by Spark) give what they give on ``local[2]``.

Not part of ``make test`` (its name does not match ``test_*.py``): it starts three more JVMs
and takes 2 to 7 minutes on a 2-core machine. ``make spark-cluster`` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from kmq.audit.job import AuditConfig, run_audit
from kmq.config import ServiceConfig
from kmq.topics import ensure_topics
from tests.functional.test_spark_audit import MINUTE_MS, Scenario, write_scenario

VOLATILE = ("timing_s",)


def _stable(summary: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in summary.items() if k not in VOLATILE}
    out["snapshot"] = {k: v for k, v in summary["snapshot"].items() if not k.startswith("as_of")}
    return out


@pytest.mark.timeout(900)
def test_audit_and_stream_on_two_executors_equal_local(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    queue_topic, marker_topic = f"cl{tag}.queue", f"cl{tag}.markers"
    ensure_topics(ServiceConfig(bootstrap_servers=bootstrap, queue_topic=queue_topic,
                                marker_topic=marker_topic, queue_partitions=2,
                                marker_partitions=3))  # fmt: skip
    write_scenario(Scenario(bootstrap, queue_topic, marker_topic,
                            int(time.time() * 1000) - 10 * MINUTE_MS))  # fmt: skip
    cluster = tmp_path / "cluster"
    child = subprocess.run(
        [sys.executable, "-m", "tests.functional.spark_cluster_job",
         "--bootstrap-servers", bootstrap, "--queue-topic", queue_topic,
         "--marker-topic", marker_topic, "--out", str(cluster)],
        capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-4000:]
    info = json.loads((cluster / "cluster.json").read_text())
    assert info["master"] == "local-cluster[2,1,1024]" and info["executors"] == 2
    print(f"local-cluster: {info['timings']}")
    assert max(info["batches"]) <= 20 and sum(info["batches"]) > 20

    local = run_audit(
        spark,
        AuditConfig(bootstrap_servers=bootstrap, output=tmp_path / "local",
                    queue_topic=queue_topic, marker_topic=marker_topic,
                    max_records_per_split=16, html=False),
        say=lambda _: None,
    )  # fmt: skip
    remote = json.loads((cluster / "audit" / "summary.json").read_text())
    assert _stable(remote) == _stable(local)
    assert remote["overall"]["lost"] == 2  # the scenario's, so not two empty summaries

    streamed = sorted(map(tuple, spark.read.parquet(str(cluster / "stream")).collect()))
    batch = (
        spark.read.format("kmq").option("kind", "markers")
        .option("bootstrap_servers", bootstrap).option("topic", marker_topic).load()
        .select("marker_partition", "marker_offset", "type", "error").collect()
    )  # fmt: skip
    assert streamed == sorted(map(tuple, batch))
