"""Options shared by several commands."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from kmq.errors import KmqError

F = TypeVar("F", bound=Callable[..., Any])

_SECURITY_PARAMS = (
    "security_protocol",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_check_hostname",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_oauth_token_provider",
)


def load_token_provider(spec: str) -> Any:
    """``module:name`` of an OAUTHBEARER token provider: a kafka-python
    ``AbstractTokenProvider`` instance, or a class or function that returns one when
    called without arguments."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(
            f"{spec!r} is not MODULE:NAME", param_hint="--sasl-oauth-token-provider"
        )
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(
            f"cannot load {spec!r}: {exc}", param_hint="--sasl-oauth-token-provider"
        ) from None
    from kafka.net.sasl.oauth import AbstractTokenProvider

    return found if isinstance(found, AbstractTokenProvider) else found()


def security_options(func: F) -> F:
    """Kafka TLS and SASL options (each with a ``KMQ_*`` environment variable). The command
    gets them as one ``security`` argument, a :class:`kmq.KafkaSecurity`."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kmq.kafka_clients import KafkaSecurity

        settings = {name: kwargs.pop(name) for name in _SECURITY_PARAMS}
        provider = settings.pop("sasl_oauth_token_provider")
        try:
            security = KafkaSecurity(
                **settings,
                sasl_oauth_token_provider=load_token_provider(provider) if provider else None,
            )
        except KmqError as exc:
            raise click.UsageError(str(exc)) from exc
        return func(*args, security=security, **kwargs)

    options: list[Callable[[F], F]] = [
        click.option(
            "--security-protocol",
            envvar="KMQ_SECURITY_PROTOCOL",
            show_envvar=True,
            default="PLAINTEXT",
            type=click.Choice(
                ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"], case_sensitive=False
            ),
            help="How to reach Kafka.",
        ),
        click.option(
            "--ssl-cafile",
            envvar="KMQ_SSL_CAFILE",
            show_envvar=True,
            help="CA bundle (PEM) for the broker certificates [default: the system's].",
        ),
        click.option(
            "--ssl-certfile",
            envvar="KMQ_SSL_CERTFILE",
            show_envvar=True,
            help="Client certificate (PEM), for mutual TLS.",
        ),
        click.option(
            "--ssl-keyfile", envvar="KMQ_SSL_KEYFILE", show_envvar=True, help="Client key (PEM)."
        ),
        click.option(
            "--ssl-password",
            envvar="KMQ_SSL_PASSWORD",
            show_envvar=True,
            help="Password of the client key (prefer the environment variable).",
        ),
        click.option(
            "--ssl-check-hostname/--no-ssl-check-hostname",
            envvar="KMQ_SSL_CHECK_HOSTNAME",
            show_envvar=True,
            default=True,
            help="Check that the broker certificate names the broker's host.",
        ),
        click.option(
            "--sasl-mechanism",
            envvar="KMQ_SASL_MECHANISM",
            show_envvar=True,
            type=click.Choice(
                ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"], case_sensitive=False
            ),
        ),
        click.option(
            "--sasl-plain-username",
            envvar="KMQ_SASL_PLAIN_USERNAME",
            show_envvar=True,
            help="SASL user (PLAIN and SCRAM).",
        ),
        click.option(
            "--sasl-plain-password",
            envvar="KMQ_SASL_PLAIN_PASSWORD",
            show_envvar=True,
            help="SASL password (PLAIN and SCRAM; prefer the environment variable).",
        ),
        click.option(
            "--sasl-oauth-token-provider",
            envvar="KMQ_SASL_OAUTH_TOKEN_PROVIDER",
            show_envvar=True,
            metavar="MODULE:NAME",
            help="OAUTHBEARER token provider: a kafka-python AbstractTokenProvider, "
            "or a class or function making one.",
        ),
    ]
    decorated: Any = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return cast(F, decorated)


def connection_options(func: F) -> F:
    func = security_options(func)
    func = click.option(
        "--marker-topic", envvar="KMQ_MARKER_TOPIC", show_envvar=True, default="kmq.markers"
    )(func)
    func = click.option(
        "--queue-topic", envvar="KMQ_QUEUE_TOPIC", show_envvar=True, default="kmq.queue"
    )(func)
    func = click.option(
        "--bootstrap-servers",
        envvar="KMQ_BOOTSTRAP_SERVERS",
        show_envvar=True,
        required=True,
        help="Kafka bootstrap servers, host:port[,host:port].",
    )(func)
    return func


def control_topic_option(func: F) -> F:
    return click.option(
        "--control-topic", envvar="KMQ_CONTROL_TOPIC", show_envvar=True, default="kmq.control"
    )(func)


def timeout_options(func: F) -> F:
    """--session-timeout-ms and --request-timeout-ms, as kmq-tracker and kmq serve take them."""
    func = click.option(
        "--request-timeout-ms",
        envvar="KMQ_REQUEST_TIMEOUT_MS",
        show_envvar=True,
        type=int,
        default=30_000,
        help="Kafka request timeout, and how long one attempt to reach Kafka may take.",
    )(func)
    return click.option(
        "--session-timeout-ms",
        envvar="KMQ_SESSION_TIMEOUT_MS",
        show_envvar=True,
        type=int,
        default=10_000,
    )(func)
