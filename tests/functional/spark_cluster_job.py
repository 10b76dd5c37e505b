"""Run by test_spark_cluster in a child process (one SparkContext per process): the batch
audit and a streaming read on ``local-cluster[2,1,1024]``, two executor JVMs."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kmq.audit.job import AuditConfig, run_audit
from kmq.spark import get_session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--queue-topic", required=True)
    parser.add_argument("--marker-topic", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    timings: dict[str, float] = {}
    spark = get_session(
        "local-cluster[2,1,1024]",
        conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "4"},
    )
    timings["session_s"] = time.monotonic() - started
    try:
        run_audit(
            spark,
            AuditConfig(
                bootstrap_servers=args.bootstrap_servers,
                output=args.out / "audit",
                queue_topic=args.queue_topic,
                marker_topic=args.marker_topic,
                max_records_per_split=16,  # several tasks per partition, on both executors
                html=False,
            ),
            say=lambda _: None,
        )
        timings["audit_s"] = time.monotonic() - started - timings["session_s"]
        # Every executor has registered by now (the audit ran tasks on them); minus the driver.
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        query = (
            spark.readStream.format("kmq")
            .option("kind", "markers")
            .option("bootstrap_servers", args.bootstrap_servers)
            .option("topic", args.marker_topic)
            .option("max_records_per_trigger", "20")
            .load()
            .select("marker_partition", "marker_offset", "type", "error")
            .writeStream.format("parquet")
            .option("path", str(args.out / "stream"))
            .option("checkpointLocation", str(args.out / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        query.processAllAvailable()
        batches = [int(p["numInputRows"]) for p in query.recentProgress]
        query.stop()
        timings["total_s"] = time.monotonic() - started
        (args.out / "cluster.json").write_text(
            json.dumps(
                {
                    "executors": executors,
                    "batches": batches,
                    "master": spark.sparkContext.master,
                    "timings": {k: round(v, 1) for k, v in timings.items()},
                }
            )
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
