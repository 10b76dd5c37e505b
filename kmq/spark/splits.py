"""Planning a read: per-partition offset ranges, cut into Spark-sized splits. Pure Python."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kmq.errors import ConfigError


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def ranges_to_read(
    topic: str,
    bounds: Mapping[int, tuple[int, int]],
    start_offsets: Mapping[int, int] | None = None,
    end_offsets: Mapping[int, int] | None = None,
) -> list[OffsetRange]:
    """What to read of each partition, given its ``(log start, high watermark)`` bounds.

    ``start_offsets`` and ``end_offsets`` narrow the range; they are clamped to the bounds.
    With ``end_offsets``, partitions it does not name are not read at all.
    """
    out: list[OffsetRange] = []
    unknown = set(end_offsets or ()) - set(bounds)
    if unknown:
        raise ConfigError(f"end_offsets names partitions {sorted(unknown)} that {topic} lacks")
    for partition in sorted(bounds):
        if end_offsets is not None and partition not in end_offsets:
            continue
        low, high = bounds[partition]
        start = max(low, (start_offsets or {}).get(partition, low))
        end = min(high, (end_offsets or {}).get(partition, high))
        if end > start:
            out.append(OffsetRange(topic, partition, start, end))
    return out


def split_ranges(ranges: list[OffsetRange], max_records: int) -> list[OffsetRange]:
    """Cut each range into nearly equal pieces of at most ``max_records`` offsets."""
    if max_records < 1:
        raise ConfigError(f"max_records_per_split must be >= 1, got {max_records}")
    out: list[OffsetRange] = []
    for rng in ranges:
        pieces = -(-rng.size // max_records)
        step, extra = divmod(rng.size, pieces)
        start = rng.start
        for i in range(pieces):
            end = start + step + (1 if i < extra else 0)
            out.append(OffsetRange(rng.topic, rng.partition, start, end))
            start = end
    return out


def admit(start: Mapping[int, int], latest: Mapping[int, int], max_records: int) -> dict[int, int]:
    """The end offsets of one micro-batch: ``latest``, or, when that is more than
    ``max_records`` past ``start`` (where a partition it lacks starts at 0), as far as
    ``max_records`` shared fairly (a partition that needs less leaves the rest to the
    others) takes each partition."""
    if max_records < 1:
        raise ConfigError(f"max_records_per_trigger must be >= 1, got {max_records}")
    backlog = {p: max(0, hi - start.get(p, 0)) for p, hi in latest.items()}
    if sum(backlog.values()) <= max_records:
        return dict(latest)
    grant = dict.fromkeys(backlog, 0)
    budget = max_records
    waiting = sorted((p for p in backlog if backlog[p]), key=lambda p: (backlog[p], p))
    while waiting and budget:
        share = max(1, budget // len(waiting))
        p = waiting.pop(0)
        take = min(backlog[p], share, budget)
        grant[p] = take
        budget -= take
    return {p: (start.get(p, 0) + grant[p] if backlog[p] else hi) for p, hi in latest.items()}
