"""``kmq status``: backlog, in-flight messages, redeliveries, dead letters and pauses per
queue, and the tracker replicas."""

from __future__ import annotations

import itertools
import time

import click

from kmq.cli.options import connection_options, control_topic_option
from kmq.config import ServiceConfig
from kmq.errors import KmqError
from kmq.kafka_clients import KafkaSecurity


@click.command()
@connection_options
@control_topic_option
@click.option(
    "--retry-topic",
    envvar="KMQ_RETRY_TOPIC",
    show_envvar=True,
    default="",
    help="The retry topic [default: <queue topic>.retry].",
)
@click.option(
    "--tracker-group",
    envvar="KMQ_GROUP_ID",
    show_envvar=True,
    default="kmq-tracker",
    help="The trackers' consumer group.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--watch", is_flag=True, help="Redraw the table every --interval seconds.")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=2.0, help="Seconds.")
@click.option("--refreshes", type=click.IntRange(1), default=None, hidden=True)
@click.option(
    "--scan-limit",
    type=click.IntRange(1),
    default=200_000,
    help="Records read at most; past it counts are upper bounds (marked <=).",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(1, 3600),
    default=30.0,
    help="How long one report may take (and each Kafka request).",
)
@click.argument("queues", nargs=-1, metavar="[QUEUE]...")
def status(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
    retry_topic: str,
    tracker_group: str,
    as_json: bool,
    watch: bool,
    interval: float,
    refreshes: int | None,
    scan_limit: int,
    timeout_s: float,
    queues: tuple[str, ...],
) -> None:
    """Per queue: backlog, in flight (and the oldest's age), redeliveries, dead letters and
    pause; and the tracker replicas. Every queue with a consumer group, or the QUEUEs given."""
    from kmq.status import render, to_json
    from kmq.status_read import read_status

    try:
        config = ServiceConfig(
            bootstrap_servers=bootstrap_servers,
            queue_topic=queue_topic,
            marker_topic=marker_topic,
            control_topic=control_topic,
            retry_topic=retry_topic,
            security=security,
            create_topics=False,
            request_timeout_ms=int(timeout_s * 1000),
        )
    except KmqError as exc:
        raise click.UsageError(str(exc)) from None
    rounds = itertools.count() if refreshes is None else range(refreshes)
    for n in rounds if watch else range(1):
        if n:
            time.sleep(interval)  # the refresh interval
        try:
            report = read_status(
                config,
                queues,
                tracker_group=tracker_group,
                scan_limit_records=scan_limit,
                timeout_s=timeout_s,
            )
        except KmqError as exc:
            raise click.ClickException(str(exc)) from None
        if as_json:
            click.echo(to_json(report))
        else:
            if watch:
                click.clear()
            click.echo(render(report))
