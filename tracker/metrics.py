"""The tracker's Prometheus metrics: a collector that reads a :class:`tracker.view.TrackerView`
at scrape time, so the run loop counts nothing twice and pays nothing per marker.

Counters labelled by partition come from the partitions this replica owns now; a
partition that moves to another replica continues there from 0, which ``rate()`` and
``increase()`` take as a counter reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from tracker.state import CAUSES, MARKER_TYPES
from tracker.view import TrackerView

_OWN_METRIC = frozenset(
    (*MARKER_TYPES, "redeliveries", "dead_letters", "bad_marker", "in_flight")
)


def _flag(value: bool) -> float:
    return 1.0 if value else 0.0


class TrackerCollector(Collector):
    """Every ``kmq_tracker_*`` metric, from ``view()`` called once per scrape."""

    def __init__(self, view: Callable[[], TrackerView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        v = self._view()
        labels = ["partition"]
        markers = CounterMetricFamily(
            "kmq_tracker_markers_read", "Markers read, by type.", labels=[*labels, "type"]
        )
        redeliveries = CounterMetricFamily(
            "kmq_tracker_redeliveries",
            "Copies written to the retry topic, by what made the delivery due.",
            labels=[*labels, "reason"],
        )
        dead_letters = CounterMetricFamily(
            "kmq_tracker_dead_letters",
            "Messages written to their dead-letter queue, by what made the delivery due.",
            labels=[*labels, "reason"],
        )
        bad = CounterMetricFamily(
            "kmq_tracker_bad_markers", "Markers skipped as undecodable or invalid.", labels=labels
        )
        in_flight = GaugeMetricFamily(
            "kmq_tracker_in_flight_messages", "Deliveries started and not settled.", labels=labels
        )
        oldest = GaugeMetricFamily(
            "kmq_tracker_oldest_in_flight_age_seconds",
            "Age of the oldest in-flight delivery, since this replica read its START.",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "kmq_tracker_marker_lag_records",
            "Markers records not read yet (the partition's end minus the position).",
            labels=labels,
        )
        replaying = GaugeMetricFamily(
            "kmq_tracker_replaying",
            "1 while the replay gate is closed: nothing is redelivered from the partition.",
            labels=labels,
        )
        stalled = GaugeMetricFamily(
            "kmq_tracker_stalled_seconds",
            "How long reading has stood still below the partition's high watermark, once "
            "past stalled_after_s (a transaction the broker has not ended); 0 otherwise.",
            labels=labels,
        )
        for p in v.partitions:
            part = str(p.partition)
            for kind in MARKER_TYPES:
                markers.add_metric([part, kind], p.stats.get(kind, 0))
            for cause in CAUSES:
                redeliveries.add_metric([part, cause], p.stats.get(f"redeliveries:{cause}", 0))
                dead_letters.add_metric([part, cause], p.stats.get(f"dead_letters:{cause}", 0))
            bad.add_metric([part], p.stats.get("bad_marker", 0))
            in_flight.add_metric([part], p.in_flight)
            oldest.add_metric([part], p.oldest_in_flight_s)
            lag.add_metric([part], p.lag_records)
            replaying.add_metric([part], _flag(p.replaying))
            stalled.add_metric([part], p.stalled_s)
        yield from (
            markers, redeliveries, dead_letters, bad, in_flight, oldest, lag, replaying, stalled
        )
        events = CounterMetricFamily(
            "kmq_tracker_events",
            "The tracker's other counters (the stats: log line), since the process started.",
            labels=["event"],
        )
        for key, count in sorted(v.totals.items()):
            if key not in _OWN_METRIC and ":" not in key:
                events.add_metric([key], count)
        yield events
        yield GaugeMetricFamily(
            "kmq_tracker_partitions_assigned",
            "Markers partitions this replica owns.",
            value=len(v.partitions),
        )
        yield GaugeMetricFamily(
            "kmq_tracker_group_stable",
            "1 when the replica is a settled member of its consumer group.",
            value=_flag(v.group_stable and v.assignment_known),
        )
        yield GaugeMetricFamily(
            "kmq_tracker_broker_up", "1 when Kafka is reachable.", value=_flag(v.broker_up)
        )
        yield GaugeMetricFamily(
            "kmq_tracker_ready", "1 when /readyz answers ready.", value=_flag(v.ready)
        )
        yield GaugeMetricFamily(
            "kmq_tracker_last_turn_age_seconds",
            "Seconds since the run loop last turned.",
            value=v.last_turn_age_s,
        )


def registry(view: Callable[[], TrackerView]) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding a tracker's metrics."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(TrackerCollector(view))
    return reg
