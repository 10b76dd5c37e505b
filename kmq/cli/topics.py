"""``kmq topics``: create kmq's topics, and give an old queue topic a layout."""

from __future__ import annotations

from typing import Any

import click

from kmq.cli.options import connection_options, control_topic_option
from kmq.config import ServiceConfig
from kmq.control import read_control
from kmq.errors import KmqError
from kmq.kafka_clients import KafkaSecurity
from kmq.layout import TopicLayout
from kmq.topics import ensure_topics, finish_upgrade, give_layout


@click.group()
def topics() -> None:
    """Manage the queue, markers and control topics."""


def _config(**settings: Any) -> ServiceConfig:
    try:
        return ServiceConfig(**settings)
    except KmqError as exc:
        raise click.UsageError(str(exc)) from exc


@topics.command("create")
@connection_options
@control_topic_option
@click.option("--queue-partitions", type=int, default=16)
@click.option("--queue-spread", type=int, default=2, help="Partitions per queue.")
@click.option("--marker-partitions", type=int, default=4)
@click.option("--replication-factor", type=int, default=1)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="QUEUE",
    help="A queue to give partitions of its own in a queue topic created now (repeatable).",
)
def create(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
    queue_partitions: int,
    queue_spread: int,
    marker_partitions: int,
    replication_factor: int,
    queues: tuple[str, ...],
) -> None:
    """Create the queue, markers and control topics if they are missing."""
    config = _config(
        bootstrap_servers=bootstrap_servers,
        queue_topic=queue_topic,
        marker_topic=marker_topic,
        control_topic=control_topic,
        queue_partitions=queue_partitions,
        queue_spread=queue_spread,
        marker_partitions=marker_partitions,
        replication_factor=replication_factor,
        security=security,
        queues=queues,
    )
    try:
        created = ensure_topics(config)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    for name in (queue_topic, marker_topic, control_topic):
        click.echo(f"{name}: {'created' if name in created else 'exists'}")


def _describe(topic: str, layout: TopicLayout | None) -> str:
    if layout is None:
        return (
            f"{topic}: no layout (kmq 0.1): every queue on every partition, every group "
            "reads them all"
        )
    hot = ", ".join(f"{q}={n}" for q, n in sorted(layout.queues.items())) or "none"
    legacy = (
        "records of the 0.1 layout may still be written: every group reads every partition"
        if layout.legacy_end is None
        else "old-layout records end at "
        + (", ".join(f"{p}:{o}" for p, o in sorted(layout.legacy_end.items())) or "nothing")
    )
    placed = ", ".join(f"{q}@{b}" for q, b in sorted(layout.placed.items())) or "none"
    return (
        f"{topic}: {layout.spread} partition(s) per queue over {layout.partitions}; "
        f"wider queues: {hot}; placed queues: {placed}; {legacy}"
    )


@topics.command("layout")
@connection_options
@control_topic_option
@click.option(
    "--spread",
    type=int,
    help="Give a topic without a layout (kmq 0.1) this many partitions per queue.",
)
def layout(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
    spread: int | None,
) -> None:
    """Show the queue topic's layout, or give an old topic one (upgrade, step 1)."""
    config = _config(
        bootstrap_servers=bootstrap_servers,
        queue_topic=queue_topic,
        marker_topic=marker_topic,
        control_topic=control_topic,
        security=security,
    )
    found: TopicLayout | None
    try:
        if spread is not None:
            if spread < 1:
                raise click.BadParameter("must be >= 1", param_hint="--spread")
            found = give_layout(config, spread)
        else:
            found = read_control(config.connection, control_topic).layout(queue_topic)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(_describe(queue_topic, found))


@topics.command("finish-upgrade")
@connection_options
@control_topic_option
def finish(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    control_topic: str,
) -> None:
    """Upgrade, step 2: once no kmq 0.1 process writes to the queue topic, bound the old
    layout's records, so groups stop reading other queues' partitions once past them."""
    config = _config(
        bootstrap_servers=bootstrap_servers,
        queue_topic=queue_topic,
        marker_topic=marker_topic,
        control_topic=control_topic,
        security=security,
    )
    try:
        done = finish_upgrade(config)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(_describe(queue_topic, done))
