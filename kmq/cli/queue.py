"""``kmq queue``: settings of one logical queue."""

from __future__ import annotations

import click

from kmq.cli.options import connection_options, control_topic_option
from kmq.errors import KmqError
from kmq.kafka_clients import KafkaSecurity
from kmq.service import Service


@click.group()
def queue() -> None:
    """Settings of one logical queue."""


@queue.command("spread")
@connection_options
@control_topic_option
@click.argument("queue_id", metavar="QUEUE")
@click.argument("partitions", type=int)
def spread(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
    queue_id: str,
    partitions: int,
) -> None:
    """Spread QUEUE over PARTITIONS partitions of the queue topic (it can only grow)."""
    try:
        with Service(
            bootstrap_servers=bootstrap_servers,
            queue_topic=queue_topic,
            marker_topic=marker_topic,
            control_topic=control_topic,
            create_topics=False,
            security=security,
        ) as svc:
            q = svc.queue(queue_id)
            q.set_spread(partitions)
            placed = svc.write_partitions(queue_id)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{queue_id}: partitions {', '.join(map(str, placed))}")
