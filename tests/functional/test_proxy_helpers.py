"""Shared by the proxy's functional tests (no tests here): topics of their own, a tracker,
and ``kmq serve`` replicas run as child processes (killed by PID at the end)."""

from __future__ import annotations

import re
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import kmq
from kmq.topics import ensure_topics
from tests.functional.conftest import (
    REDELIVERY_TIMEOUT_S,
    Broker,
    RunningTracker,
    Topics,
    tracker_config_for,
)
from tests.functional.helpers import Child, Children
from tests.functional.tls import make_ca, make_server_cert

SECRET = "proxy-test-secret-0123456789"
TOKEN = "test-token-all-queues-0123"
LIMITED_TOKEN = "test-token-limited-0123456"
LIMITED_PATTERN = "limited-*"
KEY_ID = "AKIDKMQTEST"
KEY_SECRET = "kmq-test-secret-access-key-0123"
LIMITED_KEY_ID = "AKIDKMQLIMITED"
LIMITED_KEY_SECRET = "kmq-test-limited-access-key-0123"


def make_topics(broker: Broker, partitions: int) -> Topics:
    """Fresh topics; every queue spread over all ``partitions`` queue partitions."""
    tag = uuid.uuid4().hex[:10]
    names = Topics(f"p{tag}.queue", f"p{tag}.markers", f"p{tag}.control")
    ensure_topics(
        kmq.ServiceConfig(
            bootstrap_servers=broker.bootstrap_servers,
            queue_topic=names.queue,
            marker_topic=names.markers,
            control_topic=names.control,
            queue_partitions=partitions,
            queue_spread=partitions,
            marker_partitions=2,
        )
    )
    return names


def service(broker: Broker, topics: Topics) -> kmq.Service:
    return kmq.Service(
        bootstrap_servers=broker.bootstrap_servers,
        queue_topic=topics.queue,
        marker_topic=topics.markers,
        control_topic=topics.control,
        redelivery_timeout_s=REDELIVERY_TIMEOUT_S,
        session_timeout_ms=broker.session_timeout_ms,
    )


def running_tracker(broker: Broker, topics: Topics) -> Iterator[RunningTracker]:
    running = RunningTracker(tracker_config_for(broker, topics))
    try:
        assert running.tracker.wait_caught_up(30), "tracker never caught up"
        yield running
    finally:
        running.stop()


_TLS = ssl.create_default_context()
"""Shared by every client: building one per client (httpx's default) loads the CA bundle
each time, which makes starting 50 clients take seconds."""


@dataclass
class Replica:
    child: Child
    url: str
    ca: Path | None = None
    """The self-signed certificate of a replica serving TLS."""

    def client(self, token: str | None = TOKEN, timeout_s: float = 40.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        verify = ssl.create_default_context(cafile=str(self.ca)) if self.ca else _TLS
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, verify=verify)


def write_credentials(directory: Path) -> tuple[Path, Path]:
    tokens = directory / "tokens"
    tokens.write_text(f"# test tokens\n{TOKEN}\n{LIMITED_TOKEN} {LIMITED_PATTERN}\n")
    keys = directory / "sqs-keys"
    keys.write_text(
        f"{KEY_ID} {KEY_SECRET}\n{LIMITED_KEY_ID} {LIMITED_KEY_SECRET} {LIMITED_PATTERN}\n"
    )
    return tokens, keys


def start_replica(
    children: Children,
    broker: Broker,
    topics: Topics,
    directory: Path,
    name: str = "proxy",
    *extra: str,
    tls: bool = False,
) -> Replica:
    """``kmq serve`` on a free port of 127.0.0.1, once it listens; with ``tls``, over HTTPS
    with a certificate from a test CA (the replica's ``ca``)."""
    tokens, keys = write_credentials(directory)
    cert = None
    if tls:
        ca, ca_cert, ca_key = make_ca(directory)
        server = make_server_cert(directory, ca_cert, ca_key)
        cert = ca.cert
        extra = (*extra, "--certfile", str(server.cert), "--keyfile", str(server.key))
    child = children.python(
        name,
        "-m", "kmq.proxy",
        "--bootstrap-servers", broker.bootstrap_servers,
        "--queue-topic", topics.queue,
        "--marker-topic", topics.markers,
        "--control-topic", topics.control,
        "--port", "0",
        "--secret", SECRET,
        "--tokens-file", str(tokens),
        "--sqs-credentials-file", str(keys),
        "--redelivery-timeout-s", str(REDELIVERY_TIMEOUT_S),
        "--session-timeout-ms", str(broker.session_timeout_ms),
        "--visibility-s", "2",
        "--threads", "16",
        *extra,
    )  # fmt: skip
    line = child.wait_for(r"kmq serve listening on https?://", 60)[0]
    found = re.search(r"(https?://[\d.]+:\d+)", line)
    assert found is not None, line
    return Replica(child, found.group(1), cert)


def receive(
    client: httpx.Client, queue: str, count: int, *, wait_s: float = 10.0, **params: Any
) -> list[dict[str, Any]]:
    """Receive until ``count`` messages came or a receive came back empty."""
    got: list[dict[str, Any]] = []
    while len(got) < count:
        r = client.post(f"/v1/queues/{queue}/receive",
                        json={"max_messages": min(100, count - len(got)), "wait_s": wait_s,
                              **params})  # fmt: skip
        assert r.status_code == 200, r.text
        batch = r.json()["messages"]
        if not batch:
            break
        got.extend(batch)
    return got
