"""kmq on Apache Spark: ``format("kmq")`` for PySpark 4 (install ``kmq[spark]``).

>>> from kmq.spark import get_session
>>> spark = get_session()  # local[*], with format("kmq") registered
>>> df = (spark.read.format("kmq").option("kind", "markers")
...       .option("bootstrap_servers", "127.0.0.1:9092").load())

Importing this package imports pyspark; ``import kmq`` does not.
"""

from kmq.spark.datasource import KmqDataSource
from kmq.spark.schemas import MARKERS_SCHEMA, QUEUE_SCHEMA
from kmq.spark.session import get_session, register

__all__ = ["MARKERS_SCHEMA", "QUEUE_SCHEMA", "KmqDataSource", "get_session", "register"]
