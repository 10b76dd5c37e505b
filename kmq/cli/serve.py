"""``kmq serve``: kmq queues over HTTP (a native JSON API and an SQS-compatible one)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from kmq.cli.options import connection_options, control_topic_option, timeout_options
from kmq.kafka_clients import KafkaSecurity


def _text(path: str | None, env: str) -> str | None:
    """A credentials list from a file, else from the environment variable ``env``."""
    if path:
        try:
            return Path(path).read_text()
        except OSError as exc:
            raise click.UsageError(f"cannot read {path}: {exc}") from exc
    return os.environ.get(env) or None


@click.command()
@connection_options
@control_topic_option
@click.option("--host", envvar="KMQ_PROXY_HOST", show_envvar=True, default="127.0.0.1")
@click.option(
    "--port",
    envvar="KMQ_PROXY_PORT",
    show_envvar=True,
    type=int,
    default=8080,
    help="0 picks a free port (logged).",
)
@click.option(
    "--certfile",
    envvar="KMQ_PROXY_CERTFILE",
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False),
    help="TLS certificate (PEM).",
)
@click.option(
    "--keyfile",
    envvar="KMQ_PROXY_KEYFILE",
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False),
    help="TLS private key (PEM).",
)
@click.option(
    "--secret",
    envvar="KMQ_PROXY_SECRET",
    show_envvar=True,
    help="Signs receipt handles (HMAC-SHA256); at least 16 bytes, the same on every replica. "
    "Required.",
)
@click.option(
    "--previous-secret",
    "previous_secrets",
    multiple=True,
    envvar="KMQ_PROXY_PREVIOUS_SECRETS",
    help="Still accepted for handles (rotation); repeatable.",
)
@click.option(
    "--tokens-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Native API bearer tokens: 'TOKEN [QUEUE_PATTERN ...]' per line "
    "(else KMQ_PROXY_TOKENS, ';' or newlines between entries).",
)
@click.option(
    "--sqs-credentials-file",
    type=click.Path(exists=True, dir_okay=False),
    help="SQS access keys: 'ACCESS_KEY_ID SECRET_ACCESS_KEY [QUEUE_PATTERN ...]' per "
    "line (else KMQ_PROXY_SQS_CREDENTIALS).",
)
@click.option("--insecure-no-auth", is_flag=True, help="Development only: no credentials needed.")
@click.option(
    "--queues",
    envvar="KMQ_PROXY_QUEUES",
    show_envvar=True,
    default="",
    help="Serve only these queues (ids or prefix* patterns, comma-separated); default: any.",
)
@click.option(
    "--max-body-bytes",
    envvar="KMQ_PROXY_MAX_BODY_BYTES",
    show_envvar=True,
    type=click.IntRange(1024),
    default=2 * 1024 * 1024,
)
@click.option(
    "--visibility-s",
    envvar="KMQ_PROXY_VISIBILITY_S",
    show_envvar=True,
    type=float,
    default=30.0,
    help="Default lease of a received message.",
)
@click.option(
    "--redelivery-timeout-s",
    envvar="KMQ_REDELIVERY_TIMEOUT_S",
    show_envvar=True,
    type=float,
    default=30.0,
    help="Lease of messages a replica buffers before handing them out.",
)
@click.option(
    "--handle-ttl-s",
    envvar="KMQ_PROXY_HANDLE_TTL_S",
    show_envvar=True,
    type=float,
    default=43_200.0,
    help="How long a receipt handle is valid after its receive.",
)
@click.option(
    "--prefetch",
    envvar="KMQ_PROXY_PREFETCH",
    show_envvar=True,
    type=click.IntRange(1),
    default=100,
    help="Messages each queue's consumer may buffer.",
)
@click.option(
    "--consumer-idle-s",
    envvar="KMQ_PROXY_CONSUMER_IDLE_S",
    show_envvar=True,
    type=float,
    default=300.0,
    help="Close a queue's consumer after this long without receives.",
)
@click.option(
    "--max-attempts",
    envvar="KMQ_PROXY_MAX_ATTEMPTS",
    show_envvar=True,
    type=click.IntRange(0),
    default=5,
    help="Dead-letter a message after this many deliveries (0: never).",
)
@click.option(
    "--threads", type=click.IntRange(4), default=64, help="Threads for blocking Kafka calls."
)
@timeout_options
@click.option(
    "--max-message-bytes",
    envvar="KMQ_MAX_MESSAGE_BYTES",
    show_envvar=True,
    type=int,
    default=1_000_000,
)
@click.option(
    "--public-url",
    envvar="KMQ_PROXY_PUBLIC_URL",
    show_envvar=True,
    help="Base of SQS queue URLs (default: from each request's Host).",
)
@click.option(
    "--region",
    envvar="KMQ_PROXY_REGION",
    show_envvar=True,
    default="us-east-1",
    help="Region in SQS queue ARNs.",
)
@click.option("--counts-cache-s", type=float, default=1.0, hidden=True)
@click.option("--access-log/--no-access-log", default=False)
@click.option(
    "--log-format",
    envvar="KMQ_LOG_FORMAT",
    show_envvar=True,
    type=click.Choice(["text", "json"]),
    default="text",
)
@click.option(
    "--log-level",
    envvar="KMQ_LOG_LEVEL",
    show_envvar=True,
    default="INFO",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def serve(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
    host: str,
    port: int,
    certfile: str | None,
    keyfile: str | None,
    secret: str | None,
    previous_secrets: tuple[str, ...],
    tokens_file: str | None,
    sqs_credentials_file: str | None,
    insecure_no_auth: bool,
    queues: str,
    max_body_bytes: int,
    visibility_s: float,
    redelivery_timeout_s: float,
    handle_ttl_s: float,
    prefetch: int,
    consumer_idle_s: float,
    max_attempts: int,
    threads: int,
    session_timeout_ms: int,
    request_timeout_ms: int,
    max_message_bytes: int,
    public_url: str | None,
    region: str,
    counts_cache_s: float,
    access_log: bool,
    log_format: str,
    log_level: str,
) -> None:
    """Serve kmq queues over HTTP: a native JSON API (/v1, OpenAPI at /openapi.json) and
    an SQS-compatible one (POST /, AWS JSON 1.0, SigV4). Replicas are stateless."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            f"kmq serve needs the proxy extra ({exc.name} is missing): pip install 'kmq[proxy]'"
        ) from exc
    from kmq.errors import KmqError
    from kmq.policy import RetryPolicy
    from kmq.proxy import logs
    from kmq.proxy.auth import QueuePatterns, TokenTable, parse_credentials
    from kmq.proxy.config import ProxyConfig
    from kmq.proxy.server import Listen, serve
    from kmq.service import Service

    if bool(certfile) != bool(keyfile):
        raise click.UsageError("--certfile and --keyfile go together")
    if not secret:
        raise click.UsageError("--secret (or KMQ_PROXY_SECRET) is required")
    logs.configure(log_format, log_level)
    try:
        tokens_text = _text(tokens_file, "KMQ_PROXY_TOKENS")
        keys_text = _text(sqs_credentials_file, "KMQ_PROXY_SQS_CREDENTIALS")
        secrets = [secret.encode()] + [
            s.strip().encode() for item in previous_secrets for s in item.split(",") if s.strip()
        ]
        config = ProxyConfig(
            secrets=tuple(secrets),
            tokens=TokenTable.parse(tokens_text) if tokens_text else None,
            sqs_keys=parse_credentials(keys_text) if keys_text else None,
            insecure_no_auth=insecure_no_auth,
            queues=QueuePatterns.parse(queues),
            max_body_bytes=max_body_bytes,
            default_visibility_s=visibility_s,
            handle_ttl_s=handle_ttl_s,
            prefetch=prefetch,
            consumer_idle_s=consumer_idle_s,
            threads=threads,
            public_url=public_url,
            region=region,
            policy=RetryPolicy(max_attempts=max_attempts),
            counts_cache_s=counts_cache_s,
        )
        service = Service(
            bootstrap_servers=bootstrap_servers,
            queue_topic=queue_topic,
            marker_topic=marker_topic,
            control_topic=control_topic,
            redelivery_timeout_s=redelivery_timeout_s,
            session_timeout_ms=session_timeout_ms,
            request_timeout_ms=request_timeout_ms,
            max_message_bytes=max_message_bytes,
            client_id="kmq-proxy",
            security=security,
        )
    except (KmqError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    if insecure_no_auth:
        click.echo(
            "kmq serve: --insecure-no-auth: anyone who can reach the port can use it", err=True
        )
    from kmq import reach

    # Kafka unreachable: one line and retries with backoff, not a traceback from startup.
    reach.until_reachable(service.ensure_topics, logging.getLogger("kmq.proxy"))
    serve(service, config, Listen(host, port, certfile, keyfile, access_log))
