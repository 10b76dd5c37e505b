"""``kmq dev``: run the embedded broker in the foreground (the ``kmq[dev]`` extra)."""

from __future__ import annotations

import signal
import threading

import click

from kmq.errors import KmqError


@click.command()
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (default: a free one).")
def dev(port: int | None) -> None:
    """Start the embedded Tansu broker on 127.0.0.1 and print its bootstrap address.

    Data lives in memory only and is gone when this command stops (Ctrl-C).
    """
    from kmq.dev.embedded import EmbeddedBroker, broker_binary

    try:
        broker_binary()  # without the kmq[dev] extra: one clear line, before anything starts
        broker = EmbeddedBroker(port=port).start()
    except KmqError as exc:
        raise click.ClickException(str(exc)) from None
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        click.echo(f"KMQ_BOOTSTRAP_SERVERS={broker.bootstrap_servers}", color=False)
        click.echo("embedded broker running; Ctrl-C stops it", err=True)
        while not done.wait(0.5):
            if broker.process is None or broker.process.poll() is not None:
                raise click.ClickException("embedded broker exited")
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
