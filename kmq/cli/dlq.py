"""``kmq dlq``: inspect and replay dead letters."""

from __future__ import annotations

import click

from kmq.cli.options import connection_options
from kmq.errors import KmqError
from kmq.kafka_clients import KafkaSecurity
from kmq.service import Service


def _service(
    bootstrap_servers: str, queue_topic: str, marker_topic: str, security: KafkaSecurity
) -> Service:
    return Service(
        bootstrap_servers=bootstrap_servers,
        queue_topic=queue_topic,
        marker_topic=marker_topic,
        security=security,
    )


@click.group()
def dlq() -> None:
    """Dead-letter queues: a queue's dead letters live in the logical queue <queue>.dlq."""


@dlq.command("list")
@connection_options
@click.argument("queue")
@click.option("--limit", type=click.IntRange(1), default=100)
def list_command(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    queue: str,
    limit: int,
) -> None:
    """Show QUEUE's dead letters that no consumer has taken yet."""
    from kmq.dlq import list_dead_letters

    try:
        with _service(bootstrap_servers, queue_topic, marker_topic, security) as svc:
            letters = list_dead_letters(svc.queue(queue), limit=limit)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    for d in letters:
        click.echo(
            f"{d.message_id}  from={d.origin_queue} attempts={d.attempts} "
            f"reason={d.reason!r} bytes={len(d.payload)} at={d.partition}:{d.offset}"
        )
    click.echo(f"{len(letters)} dead letters", err=True)


@dlq.command("replay")
@connection_options
@click.argument("queue")
@click.option("--limit", type=click.IntRange(1), default=None, help="Move at most this many.")
def replay_command(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    queue: str,
    limit: int | None,
) -> None:
    """Move QUEUE's dead letters back to QUEUE, attempt count reset."""
    from kmq.dlq import replay_dead_letters

    try:
        with _service(bootstrap_servers, queue_topic, marker_topic, security) as svc:
            moved = replay_dead_letters(svc.queue(queue), limit=limit)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"replayed {moved} dead letters into {queue}")
