"""``kmq dev``: run the embedded broker in the foreground."""

from __future__ import annotations

import signal
import threading

import click

from kmq.embedded import EmbeddedBroker


@click.command()
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (default: a free one).")
def dev(port: int | None) -> None:
    """Start the embedded Tansu broker on 127.0.0.1 and print its bootstrap address.

    Data lives in memory only and is gone when this command stops (Ctrl-C).
    """
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with EmbeddedBroker(port=port) as broker:
        click.echo(f"KMQ_BOOTSTRAP_SERVERS={broker.bootstrap_servers}", color=False)
        click.echo("embedded broker running; Ctrl-C stops it", err=True)
        try:
            while not done.wait(0.5):
                if broker.process is None or broker.process.poll() is not None:
                    raise click.ClickException("embedded broker exited")
        except KeyboardInterrupt:
            pass
