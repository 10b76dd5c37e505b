"""A SparkSession with ``format("kmq")`` registered: local by default, any master on request."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from kmq.spark.datasource import KmqDataSource


def under_spark_submit() -> bool:
    """True when spark-submit (or the pyspark shell) started this Python process."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def register(spark: SparkSession) -> SparkSession:
    """Make ``format("kmq")`` available in ``spark``."""
    spark.dataSource.register(KmqDataSource)
    return spark


def get_session(
    master: str | None = None,
    app_name: str = "kmq",
    conf: Mapping[str, str] | None = None,
    *,
    log_level: str = "ERROR",
) -> SparkSession:
    """Get or create a SparkSession and register ``format("kmq")`` in it.

    ``master=None`` means ``local[*]``, unless spark-submit already chose one. In local
    mode the Python workers run this interpreter (``sys.executable``), so they import the
    same kmq; on a cluster every worker needs kmq installed (``pip install 'kmq[spark]'``).
    """
    if master is None and not under_spark_submit():
        master = "local[*]"
    builder = SparkSession.builder.appName(app_name)
    settings: dict[str, str] = {"spark.ui.showConsoleProgress": "false"}
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ["PYSPARK_PYTHON"] = sys.executable
            os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
            settings.update(
                {
                    "spark.ui.enabled": "false",
                    "spark.driver.memory": "2g",
                    # Workers forked with kmq's reader imported (see kmq.spark.daemon).
                    "spark.python.daemon.module": "kmq.spark.daemon",
                }
            )
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    shuffle = "spark.sql.shuffle.partitions"
    if shuffle not in settings and not spark.sparkContext.getConf().contains(shuffle):
        # Spark's 200 suits terabytes; audits shuffle millions of small rows.
        parallelism = spark.sparkContext.defaultParallelism
        spark.conf.set(shuffle, str(max(4, 2 * parallelism)))
    return register(spark)
