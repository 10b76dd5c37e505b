"""The Kafka client factory and its security settings: validation, secrets kept out of
reprs and messages, and the settings reaching kafka-python's constructors (stubbed)."""

from __future__ import annotations

import importlib
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka.errors import KafkaTimeoutError
from kafka.net.sasl.oauth import AbstractTokenProvider

import kmq
from kmq import join_fix, kafka_clients
from kmq.cli import main as kmq_cli
from kmq.dev.embedded import free_port
from kmq.kafka_clients import KafkaConnection, KafkaSecurity
from tracker.config import TrackerConfig

SSL_SECRET = "ssl-secret-4711"
SASL_SECRET = "sasl-secret-0815"


class Provider(AbstractTokenProvider):  # type: ignore[misc]
    def token(self) -> str:
        return "token-secret-42"


PROVIDER = Provider()


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


class Recorder:
    """Stands in for KafkaProducer / KafkaConsumer / KafkaAdminClient: records arguments."""

    calls: list[tuple[str, dict[str, Any]]] = []

    def __init__(self, **configs: Any) -> None:
        Recorder.calls.append((type(self).__name__, configs))


class StubProducer(Recorder):
    pass


class StubConsumer(Recorder):
    pass


class StubAdmin(Recorder):
    pass


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    Recorder.calls = []
    monkeypatch.setattr(kafka_clients, "KafkaProducer", StubProducer)
    monkeypatch.setattr(kafka_clients, "KafkaConsumer", StubConsumer)
    monkeypatch.setattr(kafka_clients, "KafkaAdminClient", StubAdmin)
    return Recorder.calls


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"security_protocol": "TLS"}, "security_protocol must be one of"),
        ({"sasl_mechanism": "PLAIN"}, "security_protocol is PLAINTEXT: use SASL_SSL"),
        ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}, "use SASL_SSL"),
        ({"security_protocol": "SASL_SSL"}, "needs a sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism must"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"},
            "PLAIN needs sasl_plain_username and sasl_plain_password",
        ),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
             "sasl_plain_username": "u"},
            "SCRAM-SHA-256 needs sasl_plain_password",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
            "OAUTHBEARER needs a sasl_oauth_token_provider",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
             "sasl_oauth_token_provider": object()},
            "must be a kafka.net.sasl.oauth.AbstractTokenProvider",
        ),
        ({"ssl_cafile": "/etc/hosts"}, "ssl_cafile set, but security_protocol is PLAINTEXT"),
        (
            {"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"},
            "ssl_cafile '/nonexistent/ca.pem' is not a readable file",
        ),
        ({"security_protocol": "SSL", "ssl_keyfile": "/etc/hosts"}, "ssl_keyfile needs"),
        ({"security_protocol": "SSL", "ssl_check_hostname": "no"}, "must be a bool"),
    ],
)  # fmt: skip
def test_bad_settings_are_config_errors(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(kmq.ConfigError, match=re.escape(message)):
        KafkaSecurity(**settings)


def test_plaintext_adds_nothing_to_the_clients() -> None:
    assert KafkaSecurity().kafka_args() == {}


def test_names_are_normalized() -> None:
    security = KafkaSecurity(
        security_protocol="sasl_ssl",
        sasl_mechanism="scram-sha-512",
        sasl_plain_username="u",
        sasl_plain_password="p",
    )
    assert (security.security_protocol, security.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")


def test_service_config_takes_only_kafka_security() -> None:
    with pytest.raises(kmq.ConfigError, match=re.escape("security must be a kmq.KafkaSecurity")):
        kmq.ServiceConfig(bootstrap_servers="h:1", security={"security_protocol": "SSL"})  # type: ignore[arg-type]


# -- secrets --------------------------------------------------------------------------------


def _secured(pem: Path) -> KafkaSecurity:
    return KafkaSecurity(
        security_protocol="SASL_SSL",
        ssl_cafile=str(pem),
        ssl_certfile=str(pem),
        ssl_keyfile=str(pem),
        ssl_password=SSL_SECRET,
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password=SASL_SECRET,
    )


def _no_secret(text: str) -> None:
    for secret in (SSL_SECRET, SASL_SECRET, "token-secret-42"):
        assert secret not in text


def test_secrets_stay_out_of_reprs(pem: Path) -> None:
    security = _secured(pem)
    svc_config = kmq.ServiceConfig(bootstrap_servers="h:1", security=security)
    tracker_config = TrackerConfig(bootstrap_servers="h:1", security=security)
    oauth = KafkaSecurity(
        security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=PROVIDER,
    )  # fmt: skip
    for thing in (security, svc_config, tracker_config, svc_config.connection, oauth):
        _no_secret(repr(thing))
        _no_secret(str(thing))
    assert "alice" in repr(security) and "SASL_SSL" in repr(svc_config)
    assert "Provider" not in repr(oauth)
    # kafka-python logs an admin client's configuration at DEBUG: the dict's repr.
    _no_secret(f"{kafka_clients.client_args(svc_config.connection, 'admin', {})}")


def test_secrets_stay_out_of_error_messages(pem: Path) -> None:
    attempts: list[dict[str, Any]] = [
        {"security_protocol": "PLAINTEXT", "sasl_plain_password": SASL_SECRET},
        {"security_protocol": "SASL_SSL", "sasl_plain_password": SASL_SECRET},
        {"security_protocol": "PLAINTEXT", "ssl_password": SSL_SECRET},
        {"security_protocol": "SSL", "ssl_password": SSL_SECRET},
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
         "sasl_plain_password": SASL_SECRET, "sasl_oauth_token_provider": PROVIDER},
    ]  # fmt: skip
    for settings in attempts:
        with pytest.raises(kmq.ConfigError) as caught:
            KafkaSecurity(**settings)
        _no_secret(str(caught.value))


# -- the settings reach kafka-python --------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_settings_reach_every_kind_of_client(
    stubs: list[tuple[str, dict[str, Any]]], pem: Path, mechanism: str
) -> None:
    security = KafkaSecurity(
        security_protocol="SASL_SSL",
        ssl_cafile=str(pem),
        ssl_check_hostname=False,
        sasl_mechanism=mechanism,
        sasl_plain_username="alice",
        sasl_plain_password=SASL_SECRET,
    )
    conn = KafkaConnection("h:9093", security, client_id="app", request_timeout_ms=4000)
    kafka_clients.producer(conn, "producer", acks="all")
    kafka_clients.consumer(conn, "reader", isolation_level="read_committed")
    kafka_clients.admin(conn)
    assert [kind for kind, _ in stubs] == ["StubProducer", "StubConsumer", "StubAdmin"]
    for _, args in stubs:
        assert args["security_protocol"] == "SASL_SSL"
        assert args["sasl_mechanism"] == mechanism
        assert args["sasl_plain_username"] == "alice"
        assert args["sasl_plain_password"] == SASL_SECRET
        assert args["ssl_cafile"] == str(pem) and args["ssl_check_hostname"] is False
        assert args["bootstrap_servers"] == "h:9093"
        assert args["bootstrap_timeout_ms"] == 4000
    assert [args["client_id"] for _, args in stubs] == ["app-producer", "app-reader", "app-admin"]
    assert stubs[0][1]["acks"] == "all" and stubs[1][1]["isolation_level"] == "read_committed"


def test_oauthbearer_provider_reaches_the_client(stubs: list[tuple[str, dict[str, Any]]]) -> None:
    security = KafkaSecurity(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=PROVIDER,
    )
    kafka_clients.producer(KafkaConnection("h:1", security))
    args = stubs[0][1]
    assert args["sasl_mechanism"] == "OAUTHBEARER"
    assert args["sasl_oauth_token_provider"] is PROVIDER
    assert "ssl_check_hostname" not in args and "sasl_plain_username" not in args


def test_client_settings_win_over_the_defaults(stubs: list[tuple[str, dict[str, Any]]]) -> None:
    conn = KafkaConnection("h:1", request_timeout_ms=5000)
    kafka_clients.consumer(conn, "consumer", request_timeout_ms=15000, client_id="mine")
    args = stubs[0][1]
    assert (args["request_timeout_ms"], args["client_id"]) == (15000, "mine")


def test_producers_and_consumers_keep_kafka_python_metrics_off(
    stubs: list[tuple[str, dict[str, Any]]],
) -> None:
    conn = KafkaConnection("h:1")
    kafka_clients.producer(conn, "producer")
    kafka_clients.consumer(conn, "consumer")
    kafka_clients.consumer(conn, "consumer", metrics_enabled=True)  # a caller may want them
    assert [args["metrics_enabled"] for _, args in stubs] == [False, False, True]


def test_group_consumers_get_the_join_fix(
    stubs: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    applied: list[bool] = []
    monkeypatch.setattr(join_fix, "apply", lambda: applied.append(True))
    kafka_clients.consumer(KafkaConnection("h:1"), enable_auto_commit=False)
    assert applied == []
    kafka_clients.consumer(KafkaConnection("h:1"), group_id="g")
    assert applied == [True]


def test_service_producer_uses_the_factory(
    stubs: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, pem: Path
) -> None:
    monkeypatch.setattr(kmq.Service, "ensure_topics", lambda self: None)
    svc = kmq.Service(bootstrap_servers="h:1", security=_secured(pem), max_message_bytes=4096)
    svc.kafka_producer()
    kind, args = stubs[0]
    assert kind == "StubProducer"
    assert args["acks"] == "all" and args["enable_idempotence"] is True
    assert args["linger_ms"] == 0 and args["max_request_size"] == 4096
    assert args["batch_size"] == 4096  # never a batch over the limit it sends under
    assert args["client_id"] == "kmq-producer" and args["request_timeout_ms"] == 30_000
    assert args["sasl_plain_password"] == SASL_SECRET and args["ssl_password"] == SSL_SECRET


@pytest.mark.parametrize(
    ("limit", "batch"), [(1024, 1024), (65_535, 65_535), (65_536, 65_536), (1_000_000, 65_536)]
)
def test_batches_are_64_kb_or_the_message_limit(limit: int, batch: int) -> None:
    assert kafka_clients.batch_bytes(limit) == batch


def test_service_producer_batches_up_to_64_kb(
    stubs: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kmq.Service, "ensure_topics", lambda self: None)
    kmq.Service(bootstrap_servers="h:1").kafka_producer()
    assert stubs[0][1]["batch_size"] == 65_536


def test_spark_settings_split_into_security_and_the_rest(pem: Path) -> None:
    security = _secured(pem)
    options = security.spark_options()
    assert options["security_protocol"] == "SASL_SSL" and options["ssl_check_hostname"] == "true"
    again, rest = KafkaSecurity.from_settings({**options, "fetch_max_wait_ms": 10})
    assert again == security and rest == {"fetch_max_wait_ms": 10}
    numeric, _ = KafkaSecurity.from_settings(
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
         "sasl_plain_username": "u", "sasl_plain_password": 1234}
    )  # fmt: skip
    assert numeric.sasl_plain_password == "1234"
    oauth = KafkaSecurity(
        security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=PROVIDER,
    )  # fmt: skip
    with pytest.raises(kmq.ConfigError, match="cannot be passed to Spark"):
        oauth.spark_options()


# -- command lines --------------------------------------------------------------------------


def test_tracker_flags_and_environment(monkeypatch: pytest.MonkeyPatch, pem: Path) -> None:
    import tracker.daemon
    from tracker.cli import main as tracker_main

    seen: list[TrackerConfig] = []

    class Refuse:
        def __init__(self, config: TrackerConfig) -> None:
            seen.append(config)
            raise kmq.BrokerError("cannot connect to Kafka at h:1 (SASL_SSL): stub")

    monkeypatch.setattr(tracker.daemon, "Tracker", Refuse)
    env = {
        "KMQ_BOOTSTRAP_SERVERS": "h:1",
        "KMQ_SECURITY_PROTOCOL": "SASL_SSL",
        "KMQ_SSL_CAFILE": str(pem),
        "KMQ_SSL_CHECK_HOSTNAME": "false",
        "KMQ_SASL_MECHANISM": "SCRAM-SHA-256",
        "KMQ_SASL_PLAIN_USERNAME": "alice",
        "KMQ_SASL_PLAIN_PASSWORD": SASL_SECRET,
        "KMQ_MAX_REDELIVERIES_PER_ROUND": "2000",
    }
    result = CliRunner().invoke(tracker_main, [], env=env)
    assert result.exit_code == 1, result.output
    assert "Error: cannot connect to Kafka at h:1" in result.output
    assert "Traceback" not in result.output
    assert seen[0].max_redeliveries_per_round == 2000
    security = seen[0].security
    assert security == KafkaSecurity(
        security_protocol="SASL_SSL",
        ssl_cafile=str(pem),
        ssl_check_hostname=False,
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice",
        sasl_plain_password=SASL_SECRET,
    )
    bad = CliRunner().invoke(tracker_main, ["--sasl-mechanism", "PLAIN"], env=env | {
        "KMQ_SECURITY_PROTOCOL": "SSL"})  # fmt: skip
    assert bad.exit_code == 2 and "use SASL_SSL or SASL_PLAINTEXT" in bad.output
    _no_secret(bad.output)


def test_kmq_commands_take_the_security_options(
    monkeypatch: pytest.MonkeyPatch, pem: Path
) -> None:
    dlq_module = importlib.import_module("kmq.cli.dlq")  # kmq.cli.dlq is the click group
    seen: list[dict[str, Any]] = []

    def refuse(**settings: Any) -> kmq.Service:
        seen.append(settings)
        raise kmq.BrokerError("stub")

    monkeypatch.setattr(dlq_module, "Service", refuse)
    result = CliRunner().invoke(
        kmq_cli,
        ["dlq", "list", "q", "--bootstrap-servers", "h:1", "--security-protocol", "SSL",
         "--ssl-cafile", str(pem), "--no-ssl-check-hostname"],
    )  # fmt: skip
    assert result.exit_code == 1 and "Error: stub" in result.output
    assert seen[0]["security"] == KafkaSecurity(
        security_protocol="SSL", ssl_cafile=str(pem), ssl_check_hostname=False
    )
    provider = CliRunner().invoke(
        kmq_cli,
        ["dlq", "list", "q", "--bootstrap-servers", "h:1", "--security-protocol",
         "SASL_SSL", "--sasl-mechanism", "OAUTHBEARER",
         "--sasl-oauth-token-provider", f"{__name__}:PROVIDER"],
    )  # fmt: skip
    assert provider.exit_code == 1, provider.output
    assert seen[1]["security"].sasl_oauth_token_provider is PROVIDER
    for command in (["serve"], ["audit"], ["topics", "create"], ["pause"], ["queue", "spread"]):
        help_text = CliRunner().invoke(kmq_cli, [*command, "--help"]).output
        assert "--security-protocol" in help_text and "KMQ_SASL_PLAIN_PASSWORD" in help_text


def test_audit_passes_the_security_settings_as_kafka_options(pem: Path) -> None:
    from kmq.cli.audit import _spark_security

    options = _spark_security(KafkaSecurity(security_protocol="SSL", ssl_cafile=str(pem)))
    assert options == {
        "security_protocol": "SSL", "ssl_check_hostname": "true", "ssl_cafile": str(pem),
    }  # fmt: skip


# -- an unreachable broker --------------------------------------------------------------------


def test_unreachable_broker_is_a_broker_error_within_the_request_timeout() -> None:
    port = free_port()  # nothing listens there
    conn = KafkaConnection(f"127.0.0.1:{port}", request_timeout_ms=1000)
    started = time.monotonic()
    with pytest.raises(kmq.BrokerError, match=rf"127\.0\.0\.1:{port} is unreachable"):
        kafka_clients.producer(conn, "producer")
    assert time.monotonic() - started < 3


def test_a_kafka_error_while_building_is_a_broker_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(**configs: Any) -> None:
        raise KafkaTimeoutError("Unable to bootstrap")

    monkeypatch.setattr(kafka_clients, "KafkaAdminClient", fail)
    monkeypatch.setattr(kafka_clients, "diagnose", lambda conn: "probe says no")
    with pytest.raises(kmq.BrokerError, match=r"at h:1 \(PLAINTEXT\) within 30 s: probe says no"):
        kafka_clients.admin(KafkaConnection("h:1"))
