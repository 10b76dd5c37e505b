"""The ``kmq`` command line: one module per command group."""

from __future__ import annotations

import click

from kmq.cli.audit import audit
from kmq.cli.demo import demo
from kmq.cli.dev import dev
from kmq.cli.dlq import dlq
from kmq.cli.pause import pause, resume
from kmq.cli.queue import queue
from kmq.cli.serve import serve
from kmq.cli.status import status
from kmq.cli.topics import topics


@click.group(context_settings={"show_default": True, "max_content_width": 100})
def main() -> None:
    """kmq: queues with per-message acknowledgement on Apache Kafka."""


main.add_command(dev)
main.add_command(topics)
main.add_command(demo)
main.add_command(dlq)
main.add_command(pause)
main.add_command(resume)
main.add_command(queue)
main.add_command(audit)
main.add_command(serve)
main.add_command(status)
