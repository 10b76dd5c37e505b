"""``kmq pause`` and ``kmq resume``: hold a queue's deliveries and redeliveries."""

from __future__ import annotations

import datetime
import re

import click

from kmq.cli.options import connection_options
from kmq.errors import KmqError
from kmq.kafka_clients import KafkaSecurity
from kmq.service import Service

_RELATIVE = re.compile(r"^\+?(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_until(text: str, now: datetime.datetime) -> datetime.datetime:
    """``+10m``/``30s``/``2h``/``1d`` from ``now``, or an ISO 8601 time (UTC if no zone)."""
    match = _RELATIVE.match(text.strip())
    if match:
        return now + datetime.timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration like +10m nor an ISO 8601 time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def _queue(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    control_topic: str,
    security: KafkaSecurity,
) -> Service:
    return Service(
        bootstrap_servers=bootstrap_servers,
        queue_topic=queue_topic,
        marker_topic=marker_topic,
        control_topic=control_topic,
        security=security,
    )


@click.command()
@connection_options
@click.option(
    "--control-topic", envvar="KMQ_CONTROL_TOPIC", show_envvar=True, default="kmq.control"
)
@click.argument("queue")
@click.option("--until", "until_text", required=True, help="ISO 8601 time, or +10m / +2h / +1d.")
def pause(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
    queue: str,
    until_text: str,
) -> None:
    """Pause QUEUE: consumers receive nothing and redeliveries wait until TIME or resume."""
    until = parse_until(until_text, datetime.datetime.now(datetime.UTC))
    if until <= datetime.datetime.now(datetime.UTC):
        raise click.BadParameter(f"{until.isoformat()} is in the past", param_hint="--until")
    try:
        with _queue(bootstrap_servers, queue_topic, marker_topic, control_topic, security) as svc:
            svc.queue(queue).pause(until)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{queue} paused until {until.isoformat()}")


@click.command()
@connection_options
@click.option(
    "--control-topic", envvar="KMQ_CONTROL_TOPIC", show_envvar=True, default="kmq.control"
)
@click.argument("queue")
def resume(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
    queue: str,
) -> None:
    """End QUEUE's pause now."""
    try:
        with _queue(bootstrap_servers, queue_topic, marker_topic, control_topic, security) as svc:
            svc.queue(queue).resume()
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{queue} resumed")
