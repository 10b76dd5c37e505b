"""What a tracker shows its metrics scrape and health probes: a snapshot of its state,
taken on the HTTP server's thread while the run loop goes on.

Only reads that are atomic under the GIL are used (copies of dicts, ``len``, attributes),
so taking a view costs the run loop nothing and never blocks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracker.stall import Stall
from tracker.state import PartitionState


@dataclass(frozen=True)
class PartitionView:
    partition: int
    stats: dict[str, int]
    """:attr:`PartitionState.stats`: markers read by type, redeliveries, bad markers..."""
    in_flight: int
    oldest_in_flight_s: float
    """Age of the oldest in-flight delivery since this tracker read its START (0 if none)."""
    lag_records: int
    """Markers records between the tracker's position and the partition's end."""
    replaying: bool
    """The replay gate is still closed: nothing is redelivered from the partition yet."""
    stalled_s: float = 0.0
    """How long reading has stood still short of the partition's end, once that is longer
    than ``stalled_after_s`` (:mod:`tracker.stall`); 0 otherwise."""


@dataclass(frozen=True)
class TrackerView:
    connecting: bool
    """No Kafka clients yet: the first connection is still being tried."""
    broker_up: bool
    broker_problem: str
    """Why Kafka is unreachable, or ``""``."""
    group_stable: bool
    """The replica is a member of its group with a settled assignment."""
    assignment_known: bool
    """The group has given this replica its partitions (possibly none) since it joined."""
    last_turn_age_s: float
    """Seconds since the run loop last turned."""
    partitions: tuple[PartitionView, ...] = ()
    totals: dict[str, int] = field(default_factory=dict)
    """:meth:`tracker.daemon.Tracker.stats`: this process's counters, revoked partitions'
    included."""

    @property
    def ready(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """Why the replica is not ready (empty when it is)."""
        out = []
        if self.connecting:
            out.append(f"connecting to Kafka ({self.broker_problem})")
        elif not self.broker_up:
            out.append(f"Kafka unreachable: {self.broker_problem}")
        if not self.connecting and not (self.group_stable and self.assignment_known):
            out.append("not a settled member of its group yet")
        replaying = [p.partition for p in self.partitions if p.replaying]
        if replaying:
            out.append(f"replaying partitions {replaying}")
        for p in self.partitions:
            if p.stalled_s:
                out.append(
                    f"markers partition {p.partition}: reading stalled for {p.stalled_s:.0f} s "
                    "below the high watermark (a transaction the broker has not ended)"
                )
        return out


def partition_view(state: PartitionState, now: float, stall: Stall | None = None) -> PartitionView:
    """``state`` (and its :class:`~tracker.stall.Stall`) as of now (monotonic seconds),
    read from any thread."""
    oldest = None
    for _ in range(3):  # the run loop may change the dict under the read: read again
        try:
            oldest = state.oldest_read_at()
            break
        except RuntimeError:
            continue
    position, highwater = state.position, state.highwater
    lag = highwater - position if highwater is not None and position is not None else 0
    return PartitionView(
        partition=state.partition,
        stats=dict(state.stats),
        in_flight=state.in_flight,
        oldest_in_flight_s=max(0.0, now - oldest) if oldest is not None else 0.0,
        lag_records=max(0, lag),
        replaying=state.replaying,
        stalled_s=stall.stalled_for(now) if stall is not None else 0.0,
    )
