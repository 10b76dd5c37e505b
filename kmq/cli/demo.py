"""``kmq demo``: run the main job on the embedded broker."""

from __future__ import annotations

import click

from kmq.demo import run_demo


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
    summary = run_demo(
        messages=messages,
        bootstrap_servers=bootstrap_servers,
        redelivery_timeout_s=redelivery_timeout_s,
        say=click.echo,
    )
    click.echo(
        f"summary: sent={summary.sent} acked={summary.acked} redelivered={summary.redelivered} "
        f"deliveries={summary.deliveries} duplicates={summary.duplicates} "
        f"workers_killed={summary.killed} lost={len(summary.missing)}"
    )
    if not summary.ok:
        raise click.ClickException(f"{len(summary.missing)} messages were never acked")
