"""ServiceConfig, ConsumerConfig and TrackerConfig: defaults, rejections, immutability."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest

import kmq
from kmq.config import MAX_REDELIVERY_TIMEOUT_S
from tracker.config import TrackerConfig

BOOTSTRAP = "localhost:9092"


def test_service_config_defaults_are_valid() -> None:
    cfg = kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP)
    assert cfg.bootstrap_servers == BOOTSTRAP
    assert cfg.queue_topic != cfg.marker_topic
    assert 0 < cfg.redelivery_timeout_s <= MAX_REDELIVERY_TIMEOUT_S
    assert cfg.redelivery_timeout_ms == round(cfg.redelivery_timeout_s * 1000)


def test_consumer_config_defaults_are_valid() -> None:
    cfg = kmq.ConsumerConfig()
    assert cfg.group_id is None
    assert cfg.max_in_flight >= 1


def test_tracker_config_defaults_are_valid() -> None:
    cfg = TrackerConfig(bootstrap_servers=BOOTSTRAP)
    assert cfg.bootstrap_servers == BOOTSTRAP
    assert cfg.queue_topic == kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP).queue_topic
    assert cfg.marker_topic == kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP).marker_topic


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        (["a:1", "b:2"], "a:1,b:2"),
        (("a:1",), "a:1"),
        ("[::1]:9092", "[::1]:9092"),
        ("h1:1, h2:65535", "h1:1, h2:65535"),
    ],
)
def test_bootstrap_forms_accepted(servers: Any, expected: str) -> None:
    assert kmq.ServiceConfig(bootstrap_servers=servers).bootstrap_servers == expected
    assert TrackerConfig(bootstrap_servers=servers).bootstrap_servers == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("redelivery_timeout_s", 1),
        ("redelivery_timeout_s", MAX_REDELIVERY_TIMEOUT_S),
        ("redelivery_timeout_s", 0.001),
        ("queue_topic", "a" * 243),  # and its default retry topic, "....retry", is 249
        ("queue_topic", "My_Queue.v2-x"),
        ("retry_topic", "r" * 249),
        ("max_message_bytes", 1024),
        ("session_timeout_ms", 1000),
        ("create_topics", False),
        ("queues", ("orders", "invoices")),
        ("queues", ()),
    ],
)
def test_service_config_boundary_values_accepted(field: str, value: Any) -> None:
    cfg = kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP, **{field: value})
    assert getattr(cfg, field) == value


@pytest.mark.parametrize("cls", [kmq.ServiceConfig, TrackerConfig])
def test_retry_topic_defaults_to_the_queue_topics(cls: type) -> None:
    assert cls(bootstrap_servers=BOOTSTRAP, queue_topic="orders").retry_topic == "orders.retry"
    assert cls(bootstrap_servers=BOOTSTRAP, retry_topic="mine").retry_topic == "mine"


@pytest.mark.parametrize("cls", [kmq.ServiceConfig, TrackerConfig])
def test_a_queue_topic_too_long_for_a_default_retry_topic_says_so(cls: type) -> None:
    with pytest.raises(kmq.ConfigError, match="retry_topic must be a topic name"):
        cls(bootstrap_servers=BOOTSTRAP, queue_topic="a" * 249)
    long = cls(bootstrap_servers=BOOTSTRAP, queue_topic="a" * 249, retry_topic="short")
    assert long.retry_topic == "short"


def test_queues_are_kept_as_a_tuple() -> None:
    settings: dict[str, Any] = {"queues": ["b", "a"]}  # a list, as from a config file
    cfg = kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP, **settings)
    assert cfg.queues == ("b", "a"), "in the order given: placement follows it"


def test_redelivery_timeout_is_normalised_to_float() -> None:
    cfg = kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP, redelivery_timeout_s=5)
    assert type(cfg.redelivery_timeout_s) is float


BAD_BOOTSTRAP: list[Any] = [
    "",
    "   ",
    "localhost",
    ":9092",
    "host:",
    "host:0",
    "host:65536",
    "host:-1",
    "host:http",
    "host:9092,",
    "host:²",  # isdigit() but not a port
    "host:٣",  # Arabic-Indic digit three
    None,
    9092,
    [],
]

BAD_TOPICS = ["", ".", "..", "a" * 250, "has space", "slash/topic", "ümlaut", "tab\t", 7, None]

BAD_SECONDS = [0, -1, -0.5, math.nan, math.inf, -math.inf, True, "30", None, 10**400]

BAD_SERVICE = [
    *[("bootstrap_servers", v) for v in BAD_BOOTSTRAP],
    *[("queue_topic", v) for v in BAD_TOPICS],
    *[("marker_topic", v) for v in BAD_TOPICS],
    *[("redelivery_timeout_s", v) for v in [*BAD_SECONDS, MAX_REDELIVERY_TIMEOUT_S + 0.001]],
    *[
        (field, v)
        for field in ("queue_partitions", "marker_partitions", "replication_factor")
        for v in (0, -1, True, False, 1.0, "4", None)
    ],
    ("max_message_bytes", 1023),
    ("max_message_bytes", True),
    ("session_timeout_ms", 999),
    ("session_timeout_ms", 10_000.0),
    ("request_timeout_ms", 0),
    ("create_topics", 1),
    ("create_topics", "yes"),
    ("client_id", ""),
    ("client_id", 5),
    ("queues", "orders"),  # a string is not a list of queues
    ("queues", b"orders"),
    ("queues", None),
    ("queues", {"orders"}),  # no order: placement would not be repeatable
    ("queues", ["orders", ""]),
    ("queues", ["has space"]),
    ("queues", [7]),
    ("queues", ["orders", "orders"]),
]


def _field_pattern(field: str) -> str:
    return "bootstrap" if field == "bootstrap_servers" else re.escape(field)


@pytest.mark.parametrize(("field", "value"), BAD_SERVICE)
def test_service_config_rejects(field: str, value: object) -> None:
    settings: dict[str, Any] = {"bootstrap_servers": BOOTSTRAP, field: value}
    with pytest.raises(kmq.ConfigError, match=_field_pattern(field)):
        kmq.ServiceConfig(**settings)


@pytest.mark.parametrize("cls", [kmq.ServiceConfig, TrackerConfig])
@pytest.mark.parametrize(
    "topics",
    [
        {"queue_topic": "same", "marker_topic": "same"},
        {"queue_topic": "same", "control_topic": "same"},
        {"marker_topic": "same", "control_topic": "same"},
        {"retry_topic": "same", "marker_topic": "same"},
        {"retry_topic": "same", "queue_topic": "same"},
        {"queue_topic": "q", "control_topic": "q.retry"},
    ],
)
def test_topics_must_differ(cls: type, topics: dict[str, str]) -> None:
    with pytest.raises(kmq.ConfigError, match="must be different"):
        cls(bootstrap_servers=BOOTSTRAP, **topics)


BAD_CONSUMER = [
    *[("max_in_flight", v) for v in (0, -1, True, 2.0, "10", None)],
    *[("poll_timeout_ms", v) for v in (0, False, 100.0)],
    *[("keepalive_fraction", v) for v in (0.049, 0.51, 0, 1, math.nan, True, "0.3", None)],
    *[("group_id", v) for v in ("", 5, b"group")],
    *[("rebalance", v) for v in ("", "Eager", "sticky", None, True)],
]


@pytest.mark.parametrize(("field", "value"), BAD_CONSUMER)
def test_consumer_config_rejects(field: str, value: Any) -> None:
    with pytest.raises(kmq.ConfigError, match=re.escape(field)):
        kmq.ConsumerConfig(**{field: value})


@pytest.mark.parametrize("fraction", [0.05, 0.5, 1 / 3])
def test_consumer_keepalive_fraction_bounds_accepted(fraction: float) -> None:
    assert kmq.ConsumerConfig(keepalive_fraction=fraction).keepalive_fraction == fraction


BAD_TRACKER = [
    *[("bootstrap_servers", v) for v in BAD_BOOTSTRAP],
    *[("queue_topic", v) for v in BAD_TOPICS],
    *[("marker_topic", v) for v in BAD_TOPICS],
    ("group_id", ""),
    ("group_id", None),
    *[("rebalance", v) for v in ("", "EAGER", None)],
    *[("default_redelivery_timeout_s", v) for v in BAD_SECONDS],
    ("default_redelivery_timeout_s", MAX_REDELIVERY_TIMEOUT_S * 2),
    *[("commit_interval_s", v) for v in (*BAD_SECONDS, 3601)],
    *[("redelivery_retry_s", v) for v in (0, math.nan, 3601)],
    *[("stats_interval_s", v) for v in (0, -1, 86_401)],
    ("session_timeout_ms", 999),
    ("request_timeout_ms", True),
    ("poll_timeout_ms", 0),
    ("max_redeliveries_per_round", 0),
    ("max_redeliveries_per_round", 1.5),
    ("max_message_bytes", 1023),
    ("max_message_bytes", True),
    *[("unread_copy_s", v) for v in (-1, math.nan, 3601, "2", True, False)],
    *[("adopt_after_s", v) for v in (-1, math.nan, 3601, "2", True, False, 1.0, 1.999)],
    *[("stalled_after_s", v) for v in (0, -1, math.nan, 86_401, "30", True)],
]


def test_adoption_may_be_turned_off_and_waits_two_beacons_at_least() -> None:
    assert TrackerConfig(bootstrap_servers=BOOTSTRAP).adopt_after_s == 2.0
    assert TrackerConfig(bootstrap_servers=BOOTSTRAP, adopt_after_s=0).adopt_after_s == 0
    assert TrackerConfig(bootstrap_servers=BOOTSTRAP, adopt_after_s=2).adopt_after_s == 2


def test_unread_copies_may_be_left_unwatched() -> None:
    assert TrackerConfig(bootstrap_servers=BOOTSTRAP).unread_copy_s == 2.0
    assert TrackerConfig(bootstrap_servers=BOOTSTRAP, unread_copy_s=0).unread_copy_s == 0


@pytest.mark.parametrize(("field", "value"), BAD_TRACKER)
def test_tracker_config_rejects(field: str, value: object) -> None:
    settings: dict[str, Any] = {"bootstrap_servers": BOOTSTRAP, field: value}
    with pytest.raises(kmq.ConfigError, match=_field_pattern(field)):
        TrackerConfig(**settings)


def test_config_error_is_a_kmq_error_and_a_value_error() -> None:
    assert issubclass(kmq.ConfigError, kmq.KmqError)
    assert issubclass(kmq.ConfigError, ValueError)


@pytest.mark.parametrize(
    ("config", "field", "value"),
    [
        (kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP), "queue_topic", "other"),
        (kmq.ServiceConfig(bootstrap_servers=BOOTSTRAP), "redelivery_timeout_s", -1),
        (kmq.ConsumerConfig(), "max_in_flight", 5),
        (TrackerConfig(bootstrap_servers=BOOTSTRAP), "group_id", "g"),
    ],
)
def test_configs_are_frozen(config: object, field: str, value: object) -> None:
    before = getattr(config, field)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, field, value)
    assert getattr(config, field) == before
