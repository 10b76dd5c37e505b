"""``kmq demo``: run the main job on the embedded broker (the ``kmq[dev]`` extra)."""

from __future__ import annotations

import click

from kmq.errors import KmqError


@click.command()
@click.option("--messages", type=click.IntRange(1, 100_000), default=30)
@click.option(
    "--bootstrap-servers",
    envvar="KMQ_BOOTSTRAP_SERVERS",
    default=None,
    help="Use this Kafka instead of starting the embedded broker.",
)
@click.option("--redelivery-timeout-s", type=click.FloatRange(0.1, 60), default=2.0)
def demo(messages: int, bootstrap_servers: str | None, redelivery_timeout_s: float) -> None:
    """Producer, tracker and workers on one machine; one worker is SIGKILLed mid-message."""
    from kmq.dev.demo import run_demo
    from kmq.dev.embedded import broker_binary

    try:
        if bootstrap_servers is None:
            broker_binary()  # without the kmq[dev] extra: one clear line, before anything starts
        summary = run_demo(
            messages=messages,
            bootstrap_servers=bootstrap_servers,
            redelivery_timeout_s=redelivery_timeout_s,
            say=click.echo,
        )
    except KmqError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"summary: sent={summary.sent} acked={summary.acked} redelivered={summary.redelivered} "
        f"deliveries={summary.deliveries} duplicates={summary.duplicates} "
        f"workers_killed={summary.killed} lost={len(summary.missing)}"
    )
    if not summary.ok:
        raise click.ClickException(f"{len(summary.missing)} messages were never acked")
