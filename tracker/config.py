"""kmq-tracker settings."""

from __future__ import annotations

from dataclasses import dataclass

from kmq.config import (
    COOPERATIVE,
    EAGER,
    check_positive_int,
    check_seconds,
    check_security,
    check_topic,
    normalize_bootstrap,
    retry_topic_for,
)
from kmq.errors import ConfigError
from kmq.kafka_clients import PLAINTEXT, KafkaConnection, KafkaSecurity
from tracker.handover import BEACON_S


@dataclass(frozen=True)
class TrackerConfig:
    bootstrap_servers: str
    queue_topic: str = "kmq.queue"
    marker_topic: str = "kmq.markers"
    control_topic: str = "kmq.control"
    retry_topic: str = ""
    """Where redelivered copies go (default ``<queue_topic>.retry``): consumers read it
    before the queue topic."""
    group_id: str = "kmq-tracker"
    default_redelivery_timeout_s: float = 30.0
    """Lease used for markers whose own is missing or absurd."""
    session_timeout_ms: int = 10_000
    rebalance: str = EAGER
    """``"eager"`` (sticky): every replica gives up every partition at every rebalance, but
    keeps reading them (redelivering nothing) until the next assignment, which mostly
    gives them back. ``"cooperative"``: a replica joining, leaving or dying moves only the
    markers partitions that must move. Not the default: eager and cooperative replicas
    cannot share a group, and it has had too few full chaos runs (see the README)."""
    request_timeout_ms: int = 30_000
    commit_interval_s: float = 1.0
    poll_timeout_ms: int = 100
    max_redeliveries_per_round: int = 500
    redelivery_retry_s: float = 1.0
    stats_interval_s: float = 30.0
    client_id: str = "kmq-tracker"
    max_message_bytes: int = 1_000_000
    """The SDK's ``max_message_bytes``: set both the same, or the tracker cannot write the
    copies and dead letters of messages the SDK let through."""
    security: KafkaSecurity = PLAINTEXT
    """TLS and SASL settings of every Kafka client (default: PLAINTEXT)."""
    metrics_port: int = 0
    """Port of ``/metrics``, ``/healthz`` and ``/readyz``; 0: none."""
    liveness_timeout_s: float = 60.0
    """``/healthz`` fails once the run loop has not turned for this long."""
    unread_copy_s: float = 2.0
    """A copy no consumer has taken this long after it was written, from a retry partition
    no consumer has lately said it reads (its reader died after the copy went there), is
    copied again to one a live consumer reads. The first copy is delivered too once its
    partition has a reader again: a duplicate, traded for not waiting out the group's
    session timeout. 0: copies are never copied again."""
    tick_interval_s: float = 0.25
    """How often the owner of a markers partition with messages in flight writes a tick
    there: a successor (after a fail-over) then runs each lease it replays from, at most
    about three of these after, when its marker was on the broker, instead of starting it
    afresh. 0: no ticks and no beacons (a successor's leases start when it reads their
    markers; see :mod:`tracker.handover`)."""
    adopt_after_s: float = 2.0
    """A markers partition whose owner's beacons have not been read for this long (while
    this replica's own come back) is taken up here until the group's next assignment: its
    leases are redelivered without waiting out the owner's session and a rebalance. The
    claim fences the owner, should it only have been frozen (:mod:`tracker.orphans`).
    0: never; needs ticks (``tick_interval_s``), whose beacons say who holds what."""
    stalled_after_s: float = 30.0
    """A markers partition whose reading stands still below its high watermark this long
    is reported (an ERROR line, ``/readyz``, ``kmq_tracker_stalled_seconds``): a
    transaction the broker has not ended holds back everything written there after it.
    Apache Kafka ends one within its transaction timeout (60 s by default); a longer stall
    is a hanging transaction."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap_servers", normalize_bootstrap(self.bootstrap_servers))
        check_security(self.security)
        check_topic(self.queue_topic, "queue_topic")
        check_topic(self.marker_topic, "marker_topic")
        check_topic(self.control_topic, "control_topic")
        object.__setattr__(
            self, "retry_topic", self.retry_topic or retry_topic_for(self.queue_topic)
        )
        check_topic(self.retry_topic, "retry_topic")
        names = {self.queue_topic, self.marker_topic, self.control_topic, self.retry_topic}
        if len(names) < 4:
            raise ConfigError(
                "queue_topic, marker_topic, control_topic and retry_topic must be different"
            )
        if not isinstance(self.group_id, str) or not self.group_id:
            raise ConfigError("group_id must be a non-empty string")
        check_seconds(self.default_redelivery_timeout_s, "default_redelivery_timeout_s")
        check_positive_int(self.session_timeout_ms, "session_timeout_ms", minimum=1000)
        if self.rebalance not in (COOPERATIVE, EAGER):
            raise ConfigError(
                f"rebalance must be {COOPERATIVE!r} or {EAGER!r}, got {self.rebalance!r}"
            )
        check_positive_int(self.request_timeout_ms, "request_timeout_ms", minimum=1000)
        check_seconds(self.commit_interval_s, "commit_interval_s", maximum=3600)
        check_positive_int(self.poll_timeout_ms, "poll_timeout_ms")
        check_positive_int(self.max_redeliveries_per_round, "max_redeliveries_per_round")
        check_seconds(self.redelivery_retry_s, "redelivery_retry_s", maximum=3600)
        check_seconds(self.stats_interval_s, "stats_interval_s", maximum=86400)
        check_positive_int(self.max_message_bytes, "max_message_bytes", minimum=1024)
        check_positive_int(self.metrics_port, "metrics_port", minimum=0)
        if self.metrics_port > 65535:
            raise ConfigError(f"metrics_port must be 0 (none) to 65535, got {self.metrics_port}")
        check_seconds(self.liveness_timeout_s, "liveness_timeout_s", maximum=86400)
        check_seconds(self.stalled_after_s, "stalled_after_s", maximum=86400)
        if isinstance(self.unread_copy_s, bool) or self.unread_copy_s != 0:
            check_seconds(self.unread_copy_s, "unread_copy_s (or 0: off)", maximum=3600)
        if isinstance(self.tick_interval_s, bool) or self.tick_interval_s != 0:
            check_seconds(self.tick_interval_s, "tick_interval_s (or 0: off)", maximum=3600)
        if isinstance(self.adopt_after_s, bool) or self.adopt_after_s != 0:
            check_seconds(self.adopt_after_s, "adopt_after_s (or 0: off)", maximum=3600)
            if self.adopt_after_s < 2 * BEACON_S:
                raise ConfigError(
                    f"adopt_after_s must be 0 (off) or at least {2 * BEACON_S:g} (two "
                    f"beacons), got {self.adopt_after_s!r}"
                )

    @property
    def connection(self) -> KafkaConnection:
        """What every Kafka client of the tracker is built from."""
        return KafkaConnection(
            self.bootstrap_servers, self.security, self.client_id, self.request_timeout_ms
        )
