"""``kmq topics``: manage kmq's queue and markers topics."""

from __future__ import annotations

import click

from kmq.cli.options import connection_options
from kmq.config import ServiceConfig
from kmq.errors import KmqError
from kmq.topics import ensure_topics


@click.group()
def topics() -> None:
    """Manage the queue and markers topics."""


@topics.command("create")
@connection_options
@click.option("--queue-partitions", type=int, default=4)
@click.option("--marker-partitions", type=int, default=4)
@click.option("--replication-factor", type=int, default=1)
def create(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    queue_partitions: int,
    marker_partitions: int,
    replication_factor: int,
) -> None:
    """Create the queue and markers topics if they are missing."""
    try:
        config = ServiceConfig(
            bootstrap_servers=bootstrap_servers,
            queue_topic=queue_topic,
            marker_topic=marker_topic,
            queue_partitions=queue_partitions,
            marker_partitions=marker_partitions,
            replication_factor=replication_factor,
        )
        created = ensure_topics(config)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    for name in (queue_topic, marker_topic):
        click.echo(f"{name}: {'created' if name in created else 'exists'}")
