"""PySpark's Python worker daemon with kmq's reader already imported.

Spark forks every Python worker (the DataSource's readers, and the planning workers that
create the source and its partitions) from a daemon process. PySpark's own daemon imports
only PySpark, so each worker imported kmq, kafka-python, pyarrow and numpy again, and in
local mode PySpark itself from its zip, compiling it: on two cores that cost more than the
reading. :func:`kmq.spark.session.get_session` names this module as
``spark.python.daemon.module`` in local mode; forked workers start with all of it loaded.
"""

from __future__ import annotations

from pyspark import daemon

import kmq.spark.datasource  # noqa: F401  (and with it kmq, kafka-python, pyarrow, numpy)

if __name__ == "__main__":
    daemon.manager()  # type: ignore[no-untyped-call]
