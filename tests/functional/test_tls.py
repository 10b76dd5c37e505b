"""kmq over real TLS: a TLS terminator (test CA made at test time) in front of an embedded
broker that advertises the terminator's address, so every client connection is TLS."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import kmq
from kmq.cli import main as kmq_cli
from kmq.dev.embedded import EmbeddedBroker, free_port
from tests.functional.conftest import Topics, tracker_argv
from tests.functional.helpers import Children, get, scrape, total, wait_until
from tests.functional.tls import TlsTerminator, make_ca, make_server_cert
from tracker.config import TrackerConfig

SESSION_TIMEOUT_MS = 2000  # Tansu settles a group in about half of it
SHORT_REQUEST_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class TlsBroker:
    bootstrap_servers: str
    """The TLS terminator's address (what the broker advertises, too)."""
    ca_file: Path
    other_ca_file: Path
    """A CA that did not sign the broker's certificate."""
    terminator: TlsTerminator

    def security(self) -> kmq.KafkaSecurity:
        return kmq.KafkaSecurity(security_protocol="SSL", ssl_cafile=str(self.ca_file))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    directory = tmp_path_factory.mktemp("tls")
    ca, ca_cert, ca_key = make_ca(directory)
    server = make_server_cert(directory, ca_cert, ca_key)
    other_ca, _, _ = make_ca(directory, "another CA")
    broker_port = free_port()
    terminator = TlsTerminator(broker_port, server).start()
    try:
        with EmbeddedBroker(
            port=broker_port, advertised_port=terminator.port, log_path=directory / "tansu.log"
        ):
            yield TlsBroker(f"127.0.0.1:{terminator.port}", ca.cert, other_ca.cert, terminator)
    finally:
        terminator.stop()


@pytest.fixture
def tls_topics(tls_broker: TlsBroker) -> Topics:
    tag = uuid.uuid4().hex[:10]
    names = Topics(f"t{tag}.queue", f"t{tag}.markers", f"t{tag}.control")
    # Created over TLS by the CLI, with the security flags.
    result = CliRunner().invoke(
        kmq_cli,
        [
            "topics", "create",
            "--bootstrap-servers", tls_broker.bootstrap_servers,
            "--queue-topic", names.queue,
            "--marker-topic", names.markers,
            "--control-topic", names.control,
            "--queue-partitions", "2",
            "--marker-partitions", "2",
            "--security-protocol", "SSL",
            "--ssl-cafile", str(tls_broker.ca_file),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return names


def _service(tls_broker: TlsBroker, topics: Topics, **overrides: object) -> kmq.Service:
    settings: dict[str, object] = {
        "bootstrap_servers": tls_broker.bootstrap_servers,
        "queue_topic": topics.queue,
        "marker_topic": topics.markers,
        "control_topic": topics.control,
        "redelivery_timeout_s": 1.0,
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "security": tls_broker.security(),
    }
    settings.update(overrides)
    return kmq.Service(**settings)


def test_send_receive_ack_over_tls(tls_broker: TlsBroker, tls_topics: Topics) -> None:
    handshakes = tls_broker.terminator.handshakes
    with _service(tls_broker, tls_topics) as svc:
        q = svc.queue("tls")
        sent = q.producer().send(b"over tls", headers={"k": b"v"})
        with q.consumer() as consumer:
            msg = consumer.receive(timeout_s=15)
            assert msg is not None, "nothing received over TLS"
            assert (msg.id, msg.payload, msg.headers, msg.attempt) == (
                sent, b"over tls", {"k": b"v"}, 1,
            )  # fmt: skip
            msg.ack()
            assert consumer.receive(timeout_s=0.5) is None
    # Every connection went through the terminator: the broker advertises only its port.
    assert tls_broker.terminator.handshakes > handshakes


def test_tracker_redelivers_over_tls(
    tls_broker: TlsBroker, tls_topics: Topics, children: Children
) -> None:
    config = TrackerConfig(
        bootstrap_servers=tls_broker.bootstrap_servers,
        queue_topic=tls_topics.queue,
        marker_topic=tls_topics.markers,
        control_topic=tls_topics.control,
        group_id=f"tracker-{tls_topics.markers}",
        default_redelivery_timeout_s=1.0,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        commit_interval_s=0.2,
    )
    # kmq-tracker with its security flags (the CA through the environment variable's flag).
    port = free_port()
    children.python(
        "tracker", *tracker_argv(config, port),
        "--security-protocol", "SSL", "--ssl-cafile", str(tls_broker.ca_file),
    )  # fmt: skip
    wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "the tracker to catch up over TLS")
    with _service(tls_broker, tls_topics) as svc:
        q = svc.queue("tls-redeliver")
        sent = q.producer().send(b"again")
        with q.consumer() as consumer:
            first = consumer.receive(timeout_s=15)
            assert first is not None and first.id == sent
            first.nack(delay_s=0.1)  # the tracker writes the copy, in a transaction
            again = consumer.receive(timeout_s=15)
            assert again is not None, "the tracker did not redeliver over TLS"
            assert (again.id, again.attempt, again.payload) == (sent, 2, b"again")
            again.ack()

    def redelivered() -> float:
        return total(scrape(port), "kmq_tracker_redeliveries_total")

    wait_until(lambda: redelivered() >= 1, 5, "the tracker to count its redelivery")
    assert redelivered() == 1


def _first_send_fails(svc: kmq.Service) -> tuple[kmq.BrokerError, float]:
    started = time.monotonic()
    with pytest.raises(kmq.BrokerError) as caught:
        svc.queue("never").producer().send(b"x")
    return caught.value, time.monotonic() - started


def test_wrong_ca_is_a_clear_error_within_the_request_timeout(
    tls_broker: TlsBroker, tls_topics: Topics
) -> None:
    wrong = kmq.KafkaSecurity(security_protocol="SSL", ssl_cafile=str(tls_broker.other_ca_file))
    with _service(
        tls_broker, tls_topics, security=wrong, request_timeout_ms=SHORT_REQUEST_TIMEOUT_MS
    ) as svc:
        error, elapsed = _first_send_fails(svc)
    text = str(error)
    assert tls_broker.bootstrap_servers in text
    assert "certificate verify failed" in text, text
    assert elapsed < SHORT_REQUEST_TIMEOUT_MS / 1000 + 2, elapsed


def test_plaintext_client_on_the_tls_port_is_a_clear_error(
    tls_broker: TlsBroker, tls_topics: Topics
) -> None:
    with _service(
        tls_broker,
        tls_topics,
        security=kmq.KafkaSecurity(),
        request_timeout_ms=SHORT_REQUEST_TIMEOUT_MS,
    ) as svc:
        error, elapsed = _first_send_fails(svc)
    text = str(error)
    assert tls_broker.bootstrap_servers in text and "PLAINTEXT" in text
    assert "TLS listener?" in text, text
    assert elapsed < SHORT_REQUEST_TIMEOUT_MS / 1000 + 2, elapsed
