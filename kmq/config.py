"""Frozen, validated configuration for the SDK."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kmq.errors import ConfigError
from kmq.kafka_clients import PLAINTEXT, KafkaConnection, KafkaSecurity
from kmq.validation import check_queue_id

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

AT_LEAST_ONCE = "at_least_once"
AT_MOST_ONCE = "at_most_once"
COOPERATIVE = "cooperative"
EAGER = "eager"

MAX_REDELIVERY_TIMEOUT_S = 12 * 3600.0
"""The longest lease kmq accepts, like SQS's maximum visibility timeout."""


def check_topic(name: str, what: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 249:
        raise ConfigError(f"{what} must be a topic name of 1 to 249 characters, got {name!r}")
    bad = [c for c in name if not (c.isascii() and (c.isalnum() or c in "._-"))]
    if bad or name in (".", ".."):
        raise ConfigError(
            f"{what} {name!r} may only contain ASCII letters, digits, '.', '_' and '-'"
        )


def check_positive_int(value: object, what: str, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r}")


def check_seconds(value: object, what: str, *, maximum: float = MAX_REDELIVERY_TIMEOUT_S) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}")
    if not 0 < value <= maximum:  # also rejects NaN and infinities
        raise ConfigError(f"{what} must be > 0 and <= {maximum:g} s, got {value!r}")
    return float(value)


def check_security(security: object) -> None:
    if not isinstance(security, KafkaSecurity):
        raise ConfigError(f"security must be a kmq.KafkaSecurity, got {type(security).__name__}")


def retry_topic_for(queue_topic: str) -> str:
    """The default retry topic of a queue topic."""
    return f"{queue_topic}.retry"


def normalize_bootstrap(servers: object) -> str:
    if isinstance(servers, (list, tuple)):
        servers = ",".join(str(s) for s in servers)
    if not isinstance(servers, str) or not servers.strip():
        raise ConfigError(f"bootstrap_servers must be 'host:port[,host:port...]', got {servers!r}")
    for server in servers.split(","):
        host, sep, port = server.strip().rpartition(":")
        valid_port = port.isascii() and port.isdigit() and 0 < int(port) < 65536
        if not sep or not host or not valid_port:
            raise ConfigError(f"bootstrap server {server!r} is not 'host:port'")
    return servers


@dataclass(frozen=True)
class ServiceConfig:
    """Everything a :class:`kmq.Service` needs. Every field is checked on construction."""

    bootstrap_servers: str
    queue_topic: str = "kmq.queue"
    marker_topic: str = "kmq.markers"
    control_topic: str = "kmq.control"
    """Compacted topic holding queue pauses and topic layouts."""
    retry_topic: str = ""
    """Where the tracker writes redelivered copies (default ``<queue_topic>.retry``);
    consumers read it before the queue topic, so a copy never waits behind a backlog. Same
    partition count and layout as the queue topic when kmq creates it."""
    redelivery_timeout_s: float = 30.0
    queue_partitions: int = 16
    queue_spread: int = 2
    """Partitions each queue's records go to (and its group reads; at most
    ``queue_partitions``), when kmq creates the queue topic. Stored in the topic's layout,
    so every process agrees. Grow a hot queue's with ``Queue.set_spread()``."""
    queues: tuple[str, ...] = ()
    """Queues to place when kmq creates the queue topic: each gets ``queue_spread``
    partitions of its own (packed from partition 0, shared only once the partitions run
    out), where their ids' hashes would often put two on one partition, and each group would
    fetch and skip the other's records. Other queues, and every queue of a topic that exists
    already, are placed by hash. Clients of releases before placement cannot read such a
    layout (see the README's *Where queues live*)."""
    marker_partitions: int = 4
    replication_factor: int = 1
    create_topics: bool = True
    max_message_bytes: int = 1_000_000
    """kmq's own record size limit; keep it at or below the broker's ``message.max.bytes``."""
    session_timeout_ms: int = 10_000
    """Consumer-group session timeout. Apache Kafka accepts 6,000 ms and up by default."""
    request_timeout_ms: int = 30_000
    client_id: str = "kmq"
    security: KafkaSecurity = PLAINTEXT
    """TLS and SASL settings of every Kafka client (default: PLAINTEXT)."""
    metrics: CollectorRegistry | None = field(default=None, repr=False, compare=False)
    """A ``prometheus_client.CollectorRegistry`` to keep the SDK's ``kmq_*`` metrics in
    (see :mod:`kmq.metrics`); None, the default: no metrics, and no cost."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bootstrap_servers", normalize_bootstrap(self.bootstrap_servers))
        if self.metrics is not None and not callable(getattr(self.metrics, "register", None)):
            raise ConfigError(f"metrics must be a prometheus_client CollectorRegistry, got "
                              f"{type(self.metrics).__name__}")  # fmt: skip
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
        object.__setattr__(
            self,
            "redelivery_timeout_s",
            check_seconds(self.redelivery_timeout_s, "redelivery_timeout_s"),
        )
        check_positive_int(self.queue_partitions, "queue_partitions")
        check_positive_int(self.queue_spread, "queue_spread")
        if self.queue_spread > 1024:
            raise ConfigError(f"queue_spread must be <= 1024, got {self.queue_spread}")
        object.__setattr__(self, "queues", _check_queues(self.queues))
        check_positive_int(self.marker_partitions, "marker_partitions")
        check_positive_int(self.replication_factor, "replication_factor")
        check_positive_int(self.max_message_bytes, "max_message_bytes", minimum=1024)
        check_positive_int(self.session_timeout_ms, "session_timeout_ms", minimum=1000)
        check_positive_int(self.request_timeout_ms, "request_timeout_ms", minimum=1000)
        if not isinstance(self.create_topics, bool):
            raise ConfigError(f"create_topics must be a bool, got {self.create_topics!r}")
        if not isinstance(self.client_id, str) or not self.client_id:
            raise ConfigError("client_id must be a non-empty string")

    @property
    def redelivery_timeout_ms(self) -> int:
        return round(self.redelivery_timeout_s * 1000)

    @property
    def connection(self) -> KafkaConnection:
        """What every Kafka client of the service is built from."""
        return KafkaConnection(
            self.bootstrap_servers, self.security, self.client_id, self.request_timeout_ms
        )


@dataclass(frozen=True)
class ConsumerConfig:
    """Per-consumer settings; see :meth:`kmq.Queue.consumer`."""

    max_in_flight: int = 100
    """Most messages a consumer holds at once (buffered plus handed out, not yet settled)."""
    poll_timeout_ms: int = 20
    keepalive_fraction: float = 1 / 3
    """A KEEPALIVE goes out every ``redelivery_timeout_s * keepalive_fraction`` seconds."""
    group_id: str | None = None
    """Defaults to ``kmq.<queue_topic>.<queue>``: one consumer group per logical queue."""
    mode: str = AT_LEAST_ONCE
    """``"at_least_once"`` (markers, redelivery) or ``"at_most_once"`` (offset committed
    before the message is handed out; no markers; never redelivered)."""
    transactional: bool = False
    """Write a batch's START markers and its queue-offset commit in one Kafka transaction:
    a crash or rebalance between them then never delivers a record twice."""
    rebalance: str = COOPERATIVE
    """``"cooperative"``: a member joining or leaving the group moves only the partitions
    that must move, and every other member goes on reading through the rebalance.
    ``"eager"``: every member gives up every partition at every rebalance; needed only while
    kmq 0.1 consumers (which know only eager rebalancing) are in the same group."""
    rng: Callable[[], float] = field(default=random.random, repr=False, compare=False)
    """Random source in [0, 1) for backoff jitter; inject one to make tests deterministic."""

    def __post_init__(self) -> None:
        if self.rebalance not in (COOPERATIVE, EAGER):
            raise ConfigError(
                f"rebalance must be {COOPERATIVE!r} or {EAGER!r}, got {self.rebalance!r}"
            )
        if self.mode not in (AT_LEAST_ONCE, AT_MOST_ONCE):
            raise ConfigError(
                f"mode must be {AT_LEAST_ONCE!r} or {AT_MOST_ONCE!r}, got {self.mode!r}"
            )
        if not isinstance(self.transactional, bool):
            raise ConfigError(f"transactional must be a bool, got {self.transactional!r}")
        if self.transactional and self.mode == AT_MOST_ONCE:
            raise ConfigError("transactional applies to at_least_once consumers only")
        if not callable(self.rng):
            raise ConfigError("rng must be a callable returning a float in [0, 1)")
        check_positive_int(self.max_in_flight, "max_in_flight")
        check_positive_int(self.poll_timeout_ms, "poll_timeout_ms")
        f = self.keepalive_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.05 <= f <= 0.5:
            raise ConfigError(f"keepalive_fraction must be within [0.05, 0.5], got {f!r}")
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise ConfigError("group_id must be a non-empty string or None")


def _check_queues(queues: object) -> tuple[str, ...]:
    if isinstance(queues, (str, bytes)) or not isinstance(queues, (tuple, list)):
        raise ConfigError(f"queues must be a list of queue ids, got {type(queues).__name__}")
    for queue in queues:
        try:
            check_queue_id(queue)
        except ValueError as exc:
            raise ConfigError(f"queues: {exc}") from exc
    if len(set(queues)) < len(queues):
        raise ConfigError("queues names a queue twice")
    return tuple(queues)
