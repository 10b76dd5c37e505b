"""``spark.readStream.format("kmq")``: a kmq topic as a Structured Streaming source.

An offset is ``{"<partition>": <next offset to read>}``; Spark checkpoints it, so a
restarted query continues where it stopped. Spark 4.0's ``latestOffset()`` gets no start
and no read limit, so admission control (``max_records_per_trigger``) caps each batch from
the last end this reader planned. A new query asks for its first end before its initial
offset, so the cap then starts from ``starting_offsets``; a restarted one is told its
checkpointed end first (Spark plans it once as ``partitions(end, end)``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from kmq.spark.datasource import KafkaSplit, read_split
from kmq.spark.kafka_io import partition_bounds
from kmq.spark.options import ReadOptions, StreamOptions
from kmq.spark.splits import OffsetRange, admit, split_ranges

__all__ = ["KmqStreamReader", "StreamOptions", "decode_offsets", "encode_offsets"]

log = logging.getLogger(__name__)


def encode_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    """Spark's form of an offset: partitions as strings, in partition order."""
    return {str(p): int(offsets[p]) for p in sorted(offsets)}


def decode_offsets(offset: Mapping[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset.items()}


class KmqStreamReader(DataSourceStreamReader):
    """Micro-batches of one kmq topic, up to the high watermarks seen at each trigger."""

    def __init__(self, options: ReadOptions, stream: StreamOptions, schema: StructType) -> None:
        self.options = options
        self.stream = stream
        self.schema = schema
        self._planned: dict[int, int] | None = None
        """The last end offsets handed to Spark or planned by it (None: not known yet)."""

    def _bounds(self) -> dict[int, tuple[int, int]]:
        o = self.options
        return partition_bounds(o.bootstrap_servers, o.topic, dict(o.kafka))

    def _remember(self, end: Mapping[int, int]) -> None:
        merged = dict(self._planned or {})
        for p, offset in end.items():
            merged[p] = max(offset, merged.get(p, offset))
        self._planned = merged

    def _initial(self, bounds: Mapping[int, tuple[int, int]]) -> dict[int, int]:
        starting = self.stream.starting_offsets
        if starting == "earliest":
            return {p: lo for p, (lo, _) in bounds.items()}
        if starting == "latest":
            return {p: hi for p, (_, hi) in bounds.items()}
        return {p: min(hi, max(lo, starting.get(p, lo))) for p, (lo, hi) in bounds.items()}

    def initialOffset(self) -> dict[str, int]:
        start = self._initial(self._bounds())
        self._remember(start)
        return encode_offsets(start)

    def latestOffset(self) -> dict[str, int]:
        bounds = self._bounds()
        latest = {p: hi for p, (_, hi) in bounds.items()}
        limit = self.stream.max_records_per_trigger
        if limit is not None:
            # A new query asks for its first end before its initial offset.
            planned = self._planned if self._planned is not None else self._initial(bounds)
            # Retention may have removed offsets before the planned end: skip them.
            start = {p: max(lo, planned.get(p, lo)) for p, (lo, _) in bounds.items()}
            latest = admit(start, latest, limit)
        if self._planned is not None:  # never behind what Spark was already given
            latest = {p: max(hi, self._planned.get(p, hi)) for p, hi in latest.items()}
        self._remember(latest)
        return encode_offsets(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = decode_offsets(start), decode_offsets(end)
        self._remember(last)
        topic = self.options.topic
        ranges = [
            OffsetRange(topic, p, first.get(p, 0), hi)
            for p, hi in sorted(last.items())
            if hi > first.get(p, 0)
        ]
        return [KafkaSplit(rng) for rng in split_ranges(ranges, self.options.max_records_per_split)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, KafkaSplit):
            yield from read_split(self.options, self.schema, partition.range)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: no consumer group, nothing cached."""
