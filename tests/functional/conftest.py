"""Functional-test fixtures: a real Kafka-protocol broker, fresh topics, trackers, workers.

The broker is the embedded Tansu by default, the one at KMQ_TEST_BOOTSTRAP_SERVERS when
that is set, or Docker Compose's Kafka (pytest-docker) when KMQ_TEST_DOCKER=1. A broker
that cannot be had is an error, never a skip.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import kmq
from kmq.config import retry_topic_for
from kmq.dev.embedded import EmbeddedBroker
from kmq.topics import ensure_topics
from tests.functional.helpers import Children
from tracker.config import TrackerConfig
from tracker.daemon import Tracker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REDELIVERY_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Broker:
    bootstrap_servers: str
    session_timeout_ms: int


@dataclass(frozen=True)
class Topics:
    queue: str
    markers: str
    control: str

    @property
    def retry(self) -> str:
        return retry_topic_for(self.queue)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/functional" in str(item.path):
            item.add_marker(pytest.mark.functional)


@pytest.fixture(scope="session")
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    external = os.environ.get("KMQ_TEST_BOOTSTRAP_SERVERS")
    if external:
        # Apache Kafka refuses sessions under group.min.session.timeout.ms (6 s by default).
        yield Broker(external, 6000)
        return
    if os.environ.get("KMQ_TEST_DOCKER") == "1":
        services = request.getfixturevalue("docker_services")
        port = services.port_for("kafka", 9092)
        yield Broker(f"127.0.0.1:{port}", 6000)
        return
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as embedded:
        # Tansu settles a group in about half the session timeout, so keep it short.
        yield Broker(embedded.bootstrap_servers, 2000)


@pytest.fixture(scope="session")
def bootstrap(broker: Broker) -> str:
    """The broker's address, for tests that need nothing else of it."""
    return broker.bootstrap_servers


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark session for every Spark test (pyspark is imported only when used)."""
    from kmq.spark import get_session

    session = get_session("local[2]", conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def docker_compose_file(pytestconfig: pytest.Config) -> str:
    return str(Path(pytestconfig.rootpath) / "docker-compose.yml")


@pytest.fixture
def topics(broker: Broker) -> Topics:
    tag = uuid.uuid4().hex[:10]
    names = Topics(f"t{tag}.queue", f"t{tag}.markers", f"t{tag}.control")
    ensure_topics(
        kmq.ServiceConfig(
            bootstrap_servers=broker.bootstrap_servers,
            queue_topic=names.queue,
            marker_topic=names.markers,
            control_topic=names.control,
            queue_partitions=2,
            marker_partitions=2,
        )
    )
    return names


@pytest.fixture
def make_service(broker: Broker, topics: Topics) -> Iterator[Callable[..., kmq.Service]]:
    made: list[kmq.Service] = []

    def make(**overrides: object) -> kmq.Service:
        settings: dict[str, object] = {
            "bootstrap_servers": broker.bootstrap_servers,
            "queue_topic": topics.queue,
            "marker_topic": topics.markers,
            "control_topic": topics.control,
            "redelivery_timeout_s": REDELIVERY_TIMEOUT_S,
            "session_timeout_ms": broker.session_timeout_ms,
            "queue_partitions": 2,
            "marker_partitions": 2,
        }
        settings.update(overrides)
        svc = kmq.Service(**settings)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


@pytest.fixture
def service(make_service: Callable[..., kmq.Service]) -> kmq.Service:
    return make_service()


class RunningTracker:
    def __init__(self, config: TrackerConfig) -> None:
        self.tracker = Tracker(config)
        self.thread = threading.Thread(target=self.tracker.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.tracker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "tracker did not stop"


@pytest.fixture
def tracker_config(broker: Broker, topics: Topics) -> TrackerConfig:
    return tracker_config_for(broker, topics)


def tracker_config_for(broker: Broker, topics: Topics) -> TrackerConfig:
    """The tests' tracker settings for ``topics``: a 1 s default lease, quick commits."""
    return TrackerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        queue_topic=topics.queue,
        marker_topic=topics.markers,
        control_topic=topics.control,
        group_id=f"tracker-{topics.markers}",
        default_redelivery_timeout_s=REDELIVERY_TIMEOUT_S,
        session_timeout_ms=broker.session_timeout_ms,
        commit_interval_s=0.2,
    )


@pytest.fixture
def tracker(tracker_config: TrackerConfig) -> Iterator[Tracker]:
    """An in-process tracker that owns every markers partition and has caught up."""
    running = RunningTracker(tracker_config)
    try:
        assert running.tracker.wait_caught_up(30), "tracker never caught up"
        yield running.tracker
    finally:
        running.stop()


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    yield kids
    kids.cleanup()
    kids.dump()


@pytest.fixture(scope="module")
def kids() -> Iterator[Children]:
    """Child processes that live as long as the test module (proxy replicas, say)."""
    children = Children()
    yield children
    children.cleanup()


def tracker_argv(config: TrackerConfig, metrics_port: int = 0) -> list[str]:
    """A ``python -m tracker`` command line for ``config``; with ``metrics_port``, serving
    /metrics and the probes there (what tests wait on, rather than log text)."""
    return [
        "-m", "tracker",
        "--bootstrap-servers", config.bootstrap_servers,
        "--queue-topic", config.queue_topic,
        "--marker-topic", config.marker_topic,
        "--control-topic", config.control_topic,
        "--group-id", config.group_id,
        "--default-redelivery-timeout-s", str(config.default_redelivery_timeout_s),
        "--session-timeout-ms", str(config.session_timeout_ms),
        "--commit-interval-s", str(config.commit_interval_s),
        "--rebalance", config.rebalance,
        "--stats-interval-s", "1",
        "--tick-interval-s", str(config.tick_interval_s),
        "--adopt-after-s", str(config.adopt_after_s),
        "--metrics-port", str(metrics_port),
    ]  # fmt: skip


def worker_argv(
    broker: Broker,
    topics: Topics,
    queue: str,
    name: str,
    *,
    max_in_flight: int = 1,
    hang_after: int = -1,
    lease_s: float = REDELIVERY_TIMEOUT_S,
) -> list[str]:
    return [
        "-m", "kmq.dev.demo_worker",
        "--bootstrap-servers", broker.bootstrap_servers,
        "--queue-topic", topics.queue,
        "--marker-topic", topics.markers,
        "--control-topic", topics.control,
        "--queue", queue,
        "--name", name,
        "--redelivery-timeout-s", str(lease_s),
        "--session-timeout-ms", str(broker.session_timeout_ms),
        "--max-in-flight", str(max_in_flight),
        "--hang-after", str(hang_after),
        "--work-s", "0",
    ]  # fmt: skip
