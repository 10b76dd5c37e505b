"""The ``format("kmq")`` options, parsed and checked. Pure Python: no Spark, no Kafka."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kmq.config import check_topic, normalize_bootstrap
from kmq.errors import ConfigError
from kmq.validation import check_queue_id

Kind = Literal["queue", "markers"]

DEFAULT_TOPICS: dict[str, str] = {"queue": "kmq.queue", "markers": "kmq.markers"}
KAFKA_PREFIX = "kafka."
"""Options named ``kafka.<setting>`` go to kafka-python as ``<setting>`` (dots become
underscores): ``kafka.security_protocol=SSL``, ``kafka.sasl.mechanism=PLAIN``."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands over a case-insensitive mapping; plain dicts in tests are matched loosely too.
    value = options.get(name)
    if value is None:
        for key, candidate in options.items():
            if key.lower() == name:
                return candidate
    return value


def _int(options: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name} must be true or false, got {raw!r}")


def _scalar(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(raw)
    except ValueError:
        return raw


def kafka_settings(options: Mapping[str, str]) -> dict[str, Any]:
    """The ``kafka.*`` pass-through settings, as kafka-python keyword arguments."""
    out: dict[str, Any] = {}
    for key, raw in options.items():
        if key.lower().startswith(KAFKA_PREFIX):
            name = key[len(KAFKA_PREFIX) :].lower().replace(".", "_")
            if name and name != "bootstrap_servers":
                out[name] = _scalar(raw)
    return out


def parse_offsets(raw: str | None, name: str) -> dict[int, int] | None:
    """``'{"0": 10, "1": 0}'`` (partition to offset) into a dict, or None when absent."""
    if raw is None or not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"option {name} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f'option {name} must be a JSON object like {{"0": 42}}')
    out: dict[int, int] = {}
    for key, value in data.items():
        try:
            partition = int(key)
        except ValueError:
            raise ConfigError(f"option {name}: partition {key!r} is not an integer") from None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or partition < 0:
            raise ConfigError(f"option {name}: {key}: {value!r} is not an offset")
        out[partition] = value
    return out


def _bootstrap(options: Mapping[str, str]) -> str:
    raw = _get(options, "bootstrap_servers") or _get(options, "kafka.bootstrap.servers")
    if raw is None:
        raise ConfigError("option bootstrap_servers is required (host:port[,host:port])")
    return normalize_bootstrap(raw)


@dataclass(frozen=True)
class ReadOptions:
    """How ``spark.read.format("kmq")`` reads one topic."""

    kind: Kind
    bootstrap_servers: str
    topic: str
    queue: str | None = None
    """Only this logical queue's records (queue kind) or markers (markers kind)."""
    max_records_per_split: int = 1_000_000
    start_offsets: dict[int, int] | None = None
    end_offsets: dict[int, int] | None = None
    """Read up to these offsets instead of the high watermarks seen at planning time."""
    batch_rows: int = 20_000
    idle_timeout_ms: int = 30_000
    """Fail a split when its records stop arriving for this long."""
    kafka: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        kind = (_get(options, "kind") or "queue").strip().lower()
        if kind not in DEFAULT_TOPICS:
            raise ConfigError(f"option kind must be 'queue' or 'markers', got {kind!r}")
        topic = _get(options, "topic") or DEFAULT_TOPICS[kind]
        check_topic(topic, "option topic")
        queue = _get(options, "queue")
        if queue is not None:
            check_queue_id(queue)
        return cls(
            kind="queue" if kind == "queue" else "markers",
            bootstrap_servers=_bootstrap(options),
            topic=topic,
            queue=queue,
            max_records_per_split=_int(options, "max_records_per_split", 1_000_000),
            start_offsets=parse_offsets(_get(options, "start_offsets"), "start_offsets"),
            end_offsets=parse_offsets(_get(options, "end_offsets"), "end_offsets"),
            batch_rows=_int(options, "batch_rows", 20_000),
            idle_timeout_ms=_int(options, "idle_timeout_ms", 30_000, minimum=100),
            kafka=tuple(sorted(kafka_settings(options).items())),
        )


@dataclass(frozen=True)
class WriteOptions:
    """How ``df.write.format("kmq")`` enqueues rows."""

    bootstrap_servers: str
    topic: str = DEFAULT_TOPICS["queue"]
    marker_topic: str = DEFAULT_TOPICS["markers"]
    control_topic: str = "kmq.control"
    """Where the queue topic's layout is (which partitions each queue's records go to)."""
    queue: str | None = None
    """The logical queue for every row; required unless the DataFrame has a ``queue`` column."""
    create_topics: bool = True
    max_message_bytes: int = 1_000_000
    kafka: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        topic = _get(options, "topic") or DEFAULT_TOPICS["queue"]
        marker_topic = _get(options, "marker_topic") or DEFAULT_TOPICS["markers"]
        control_topic = _get(options, "control_topic") or "kmq.control"
        check_topic(topic, "option topic")
        check_topic(marker_topic, "option marker_topic")
        check_topic(control_topic, "option control_topic")
        queue = _get(options, "queue")
        if queue is not None:
            check_queue_id(queue)
        return cls(
            bootstrap_servers=_bootstrap(options),
            topic=topic,
            marker_topic=marker_topic,
            control_topic=control_topic,
            queue=queue,
            create_topics=_bool(options, "create_topics", True),
            max_message_bytes=_int(options, "max_message_bytes", 1_000_000, minimum=1024),
            kafka=tuple(sorted(kafka_settings(options).items())),
        )


@dataclass(frozen=True)
class StreamOptions:
    """What ``spark.readStream.format("kmq")`` adds to :class:`ReadOptions`."""

    starting_offsets: Literal["earliest", "latest"] | dict[int, int] = "earliest"
    """Where a new query starts; a restarted query continues from its checkpoint."""
    max_records_per_trigger: int | None = None
    """Admission control: at most this many offsets per micro-batch (all partitions)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        raw = (_get(options, "starting_offsets") or "earliest").strip()
        starting: Literal["earliest", "latest"] | dict[int, int]
        if raw.lower() in ("earliest", "latest"):
            starting = "earliest" if raw.lower() == "earliest" else "latest"
        else:
            parsed = parse_offsets(raw, "starting_offsets")
            starting = parsed if parsed is not None else "earliest"
        limit = _get(options, "max_records_per_trigger")
        return cls(
            starting_offsets=starting,
            max_records_per_trigger=(
                None if limit is None else _int(options, "max_records_per_trigger", 1)
            ),
        )
