"""The one place kmq builds kafka-python clients, with the connection's security settings.

Every KafkaProducer, KafkaConsumer and KafkaAdminClient of the SDK, the tracker, the CLI, the
proxy and the Spark datasource comes from :func:`producer`, :func:`consumer` or :func:`admin`.
Each takes a :class:`KafkaConnection` (bootstrap servers, a :class:`KafkaSecurity`, a client
id prefix and the request timeout) plus the settings that make that client what it is
(``acks``, ``isolation_level``, ``transactional_id``...), which are passed on unchanged.

A client that cannot bootstrap (broker unreachable, TLS mismatch, wrong CA) raises
:class:`kmq.BrokerError` after the request timeout, with the cause found by a direct probe
of the first bootstrap server. Secrets (``ssl_password``, ``sasl_plain_password``, the
OAUTHBEARER token provider) are left out of every repr and error message.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.net.sasl.oauth import AbstractTokenProvider

from kmq import join_fix, unpack
from kmq.errors import BrokerError, ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

_PROBE_TIMEOUT_S = 5.0


class _Secret(str):
    """A string kafka-python can use as a password that never shows in a repr (kafka-python
    logs an admin client's whole configuration at DEBUG)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def _optional_text(value: object, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string")
    return value


def _readable(path: str | None, what: str) -> None:
    if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
        raise ConfigError(f"{what} {path!r} is not a readable file")


@dataclass(frozen=True)
class KafkaSecurity:
    """How kmq's Kafka clients authenticate and encrypt. The default is PLAINTEXT.

    Checked on construction (:class:`kmq.ConfigError`); the secrets (``ssl_password``,
    ``sasl_plain_password``, ``sasl_oauth_token_provider``) never appear in its repr.
    """

    security_protocol: str = "PLAINTEXT"
    """``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``."""
    ssl_cafile: str | None = None
    """CA bundle (PEM) that the broker certificates must chain to (default: the system's)."""
    ssl_certfile: str | None = None
    """Client certificate (PEM), for brokers that require mutual TLS."""
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    """Password of ``ssl_keyfile``."""
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = None
    """``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` or ``OAUTHBEARER``."""
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    sasl_oauth_token_provider: AbstractTokenProvider | None = field(
        default=None, repr=False, compare=False
    )
    """For OAUTHBEARER: a ``kafka.net.sasl.oauth.AbstractTokenProvider``."""

    def __post_init__(self) -> None:
        protocol = self.security_protocol
        if not isinstance(protocol, str) or protocol.upper() not in PROTOCOLS:
            raise ConfigError(
                f"security_protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
            )
        protocol = protocol.upper()
        object.__setattr__(self, "security_protocol", protocol)
        for name in (
            "ssl_cafile",
            "ssl_certfile",
            "ssl_keyfile",
            "sasl_mechanism",
            "sasl_plain_username",
            "ssl_password",
            "sasl_plain_password",
        ):
            object.__setattr__(self, name, _optional_text(getattr(self, name), name))
        for name in ("ssl_password", "sasl_plain_password"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _Secret(value))
        if not isinstance(self.ssl_check_hostname, bool):
            raise ConfigError("ssl_check_hostname must be a bool")
        uses_ssl = protocol in ("SSL", "SASL_SSL")
        uses_sasl = protocol.startswith("SASL_")
        ssl_set = [
            n
            for n in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password")
            if getattr(self, n) is not None
        ]
        if ssl_set and not uses_ssl:
            raise ConfigError(
                f"{', '.join(ssl_set)} set, but security_protocol is {protocol}: "
                "use SSL or SASL_SSL"
            )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ConfigError("ssl_keyfile needs ssl_certfile")
        if self.ssl_password is not None and self.ssl_certfile is None:
            raise ConfigError("ssl_password needs ssl_certfile (it unlocks the client key)")
        _readable(self.ssl_cafile, "ssl_cafile")
        _readable(self.ssl_certfile, "ssl_certfile")
        _readable(self.ssl_keyfile, "ssl_keyfile")
        self._check_sasl(protocol, uses_sasl)

    def _check_sasl(self, protocol: str, uses_sasl: bool) -> None:
        mechanism = self.sasl_mechanism
        if mechanism is not None:
            mechanism = mechanism.upper()
            object.__setattr__(self, "sasl_mechanism", mechanism)
        sasl_set = [
            n
            for n in (
                "sasl_mechanism",
                "sasl_plain_username",
                "sasl_plain_password",
                "sasl_oauth_token_provider",
            )
            if getattr(self, n) is not None
        ]
        if not uses_sasl:
            if sasl_set:
                raise ConfigError(
                    f"{', '.join(sasl_set)} set, but security_protocol is {protocol}: "
                    "use SASL_SSL or SASL_PLAINTEXT"
                )
            return
        if mechanism is None:
            raise ConfigError(
                f"security_protocol {protocol} needs a sasl_mechanism ({', '.join(MECHANISMS)})"
            )
        if mechanism not in MECHANISMS:
            raise ConfigError(
                f"sasl_mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}"
            )
        if mechanism == "OAUTHBEARER":
            provider = self.sasl_oauth_token_provider
            if provider is None:
                raise ConfigError("sasl_mechanism OAUTHBEARER needs a sasl_oauth_token_provider")
            if not isinstance(provider, AbstractTokenProvider):
                raise ConfigError(
                    "sasl_oauth_token_provider must be a "
                    "kafka.net.sasl.oauth.AbstractTokenProvider (an object with token())"
                )
            extra = [
                n
                for n in ("sasl_plain_username", "sasl_plain_password")
                if getattr(self, n) is not None
            ]
            if extra:
                raise ConfigError(f"{', '.join(extra)} set, but sasl_mechanism is OAUTHBEARER")
            return
        missing = [
            n for n in ("sasl_plain_username", "sasl_plain_password") if getattr(self, n) is None
        ]
        if missing:
            raise ConfigError(f"sasl_mechanism {mechanism} needs {' and '.join(missing)}")
        if self.sasl_oauth_token_provider is not None:
            raise ConfigError(f"sasl_oauth_token_provider set, but sasl_mechanism is {mechanism}")

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def kafka_args(self) -> dict[str, Any]:
        """The kafka-python constructor arguments (none at all for PLAINTEXT, so a plaintext
        client is built exactly as without this class)."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        args: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_ssl:
            args["ssl_check_hostname"] = self.ssl_check_hostname
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password"):
                if getattr(self, name) is not None:
                    args[name] = getattr(self, name)
        if self.sasl_mechanism is not None:
            args["sasl_mechanism"] = self.sasl_mechanism
            for name in ("sasl_plain_username", "sasl_plain_password", "sasl_oauth_token_provider"):
                if getattr(self, name) is not None:
                    args[name] = getattr(self, name)
        return args

    def spark_options(self) -> dict[str, str]:
        """The settings as the Spark datasource's ``kafka.<setting>`` options (strings)."""
        if self.sasl_oauth_token_provider is not None:
            raise ConfigError(
                "an OAUTHBEARER token provider cannot be passed to Spark executors as an option"
            )
        return {
            key: (str(value).lower() if isinstance(value, bool) else str(value))
            for key, value in self.kafka_args().items()
        }

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> tuple[KafkaSecurity, dict[str, Any]]:
        """Split kafka-python settings (the Spark datasource's ``kafka.*`` options) into a
        checked :class:`KafkaSecurity` and everything else."""
        names = set(cls.__dataclass_fields__)
        mine = {k: v for k, v in settings.items() if k in names}
        for key, value in mine.items():  # options parsed as numbers: a password of digits
            if isinstance(value, int) and not isinstance(value, bool):
                mine[key] = str(value)
        hostname = mine.get("ssl_check_hostname")
        if isinstance(hostname, str) and hostname.strip().lower() in ("true", "false"):
            mine["ssl_check_hostname"] = hostname.strip().lower() == "true"
        security = cls(**mine)
        return security, {k: v for k, v in settings.items() if k not in names}


PLAINTEXT = KafkaSecurity()


@dataclass(frozen=True)
class KafkaConnection:
    """Where and how to reach Kafka, shared by every client a kmq process builds."""

    bootstrap_servers: str
    security: KafkaSecurity = PLAINTEXT
    client_id: str = "kmq"
    """Prefix of every client's id (``<client_id>-<role>``)."""
    request_timeout_ms: int = 30_000
    """Each client's request timeout unless it sets its own, and how long a client may
    take to reach the cluster at all (kafka-python's ``bootstrap_timeout_ms``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.security, KafkaSecurity):
            raise ConfigError(f"security must be a kmq.KafkaSecurity, got {self.security!r}")


def connection(servers: str | KafkaConnection) -> KafkaConnection:
    """``servers`` as a connection (a plain ``host:port`` string means PLAINTEXT)."""
    return servers if isinstance(servers, KafkaConnection) else KafkaConnection(servers)


def client_args(
    conn: KafkaConnection, role: str | None, settings: Mapping[str, Any]
) -> dict[str, Any]:
    """Everything a client constructor gets: connection, security, then ``settings``."""
    return {
        "bootstrap_servers": conn.bootstrap_servers,
        "client_id": f"{conn.client_id}-{role}" if role else conn.client_id,
        "request_timeout_ms": conn.request_timeout_ms,
        "bootstrap_timeout_ms": conn.request_timeout_ms,
        **conn.security.kafka_args(),
        **settings,
    }


_NO_METRICS = {"metrics_enabled": False}
"""kafka-python's own metrics (sensors recorded on every send, batch and request) stay off
in kmq's producers and consumers: nothing in kmq reads them (kmq's metrics are its own).
Measured on the embedded broker: a producer sending 100-byte records used 10.7 against
13.3 µs of CPU per record (medians of 4 alternated runs each); a consumer showed no
difference."""


def batch_bytes(max_message_bytes: int) -> int:
    """The batch size per partition of a producer that writes many records at once (the
    SDK's shared producer, the tracker's redeliveries): 64 KB (kafka-python's default is
    16 KB), never over ``max_message_bytes``, since a batch is one message to the broker's
    size limit.

    While earlier batches wait for the broker, kafka-python wakes its sender thread on every
    send into a partition with more than one batch queued, and the sender then sends
    near-empty batches: with 16 KB batches of kmq's records, 88,800 to 99,800 wake-ups for
    100,000 ``send(wait=False)`` calls; with 64 KB, 21,000 to 23,000. Measured on the embedded
    broker, 100,000 sends of 100 bytes through the SDK: 31-37 against 17-21 µs of CPU per
    send (4 alternated runs each; raw kafka-python 9.8-11.1 and 10.3-11.3); a transaction of
    2,000 such records: 22-23 against 14-17 µs per record (3 alternated runs each)."""
    return min(65_536, max_message_bytes)


def producer(
    conn: KafkaConnection, role: str | None = None, *, explain: bool = True, **settings: Any
) -> KafkaProducer:
    """A KafkaProducer for ``conn``; ``settings`` (acks, idempotence...) win over defaults.
    ``explain=False``: if the cluster cannot be reached, say so without probing why (the
    probe may wait seconds more for a connection)."""
    return _build(KafkaProducer, conn, role, {**_NO_METRICS, **settings}, explain)


_GIVE_UP_JOIN_S = 1.0
"""How long :func:`close_producer` waits for a producer's I/O thread to fail what is left."""


def close_producer(producer: Any, timeout_s: float) -> None:
    """``producer.close(timeout_s)`` that stops the producer even with records unanswered.

    kafka-python 3.0.12's ``close()`` flushes first and raises KafkaTimeoutError when that
    flush times out, before it stops its I/O thread: a producer given up while the network
    is down (a tracker's stuck round) kept its thread, connections and records, retrying,
    after it was dropped, and its ``__del__`` printed the error as a traceback. This then
    does what ``close()`` does after its flush: force-closes the thread, which fails the
    records left (their futures say so), and closes the producer. Never raises for
    unanswered records; other errors are the caller's."""
    try:
        producer.close(timeout=timeout_s)
        return
    except KafkaTimeoutError:
        pass
    sender = getattr(producer, "_sender", None)  # kafka-python's own, not public API
    if sender is not None:
        sender.force_close()
        sender.join(_GIVE_UP_JOIN_S)
    # If the thread did not stop in time, it stops on its own, failing the records.
    with contextlib.suppress(KafkaTimeoutError):
        producer.close(timeout=0)


def consumer(conn: KafkaConnection, role: str | None = None, **settings: Any) -> KafkaConsumer:
    """A KafkaConsumer for ``conn``, unpacking fetched records with :mod:`kmq.unpack`. A
    group member (``group_id``) gets :mod:`kmq.join_fix` installed first."""
    if settings.get("group_id") is not None:
        join_fix.apply()
    client = _build(KafkaConsumer, conn, role, {**_NO_METRICS, **settings})
    unpack.install(client)
    return client


def admin(conn: KafkaConnection, role: str | None = "admin", **settings: Any) -> KafkaAdminClient:
    """A KafkaAdminClient for ``conn``."""
    return _build(KafkaAdminClient, conn, role, settings)


def _build(
    kind: Any,
    conn: KafkaConnection,
    role: str | None,
    settings: Mapping[str, Any],
    explain: bool = True,
) -> Any:
    args = client_args(conn, role, settings)
    try:
        return kind(**args)
    except KafkaError:
        timeout_ms = args["bootstrap_timeout_ms"]
        why = diagnose(conn) if explain else "no answer"
        raise BrokerError(
            f"cannot connect to Kafka at {conn.bootstrap_servers} "
            f"({conn.security.security_protocol}) within {timeout_ms / 1000:g} s: {why}"
        ) from None


def diagnose(conn: KafkaConnection, timeout_s: float = _PROBE_TIMEOUT_S) -> str:
    """Why the first bootstrap server cannot be used, found by connecting to it directly
    (and shaking hands, for SSL). Never includes a secret."""
    first = conn.bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    host = host.strip("[]")
    security = conn.security
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError as exc:
        return f"{first} is unreachable ({exc.strerror or exc})"
    with sock:
        if not security.uses_ssl:
            return (
                f"{first} accepts connections but gave no Kafka answer over "
                f"{security.security_protocol} (a TLS listener? then use SSL or SASL_SSL)"
            )
        try:
            context = ssl.create_default_context(cafile=security.ssl_cafile)
            context.check_hostname = security.ssl_check_hostname
            if security.ssl_certfile is not None:
                context.load_cert_chain(
                    security.ssl_certfile, security.ssl_keyfile, security.ssl_password
                )
            with context.wrap_socket(sock, server_hostname=host):
                pass
        except ssl.SSLCertVerificationError as exc:
            why = exc.verify_message or exc.reason
            return f"TLS handshake with {first} failed: certificate verify failed ({why})"
        except ssl.SSLError as exc:
            return f"TLS handshake with {first} failed: {exc.reason or type(exc).__name__}"
        except OSError as exc:
            return f"TLS handshake with {first} failed: {exc.strerror or type(exc).__name__}"
        return (
            f"TLS with {first} works, but the broker gave no Kafka answer (check the SASL "
            "settings, and that the broker's advertised listeners are reachable)"
        )
