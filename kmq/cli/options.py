"""Options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def connection_options(func: F) -> F:
    func = click.option(
        "--marker-topic", envvar="KMQ_MARKER_TOPIC", show_envvar=True, default="kmq.markers"
    )(func)
    func = click.option(
        "--queue-topic", envvar="KMQ_QUEUE_TOPIC", show_envvar=True, default="kmq.queue"
    )(func)
    func = click.option(
        "--bootstrap-servers",
        envvar="KMQ_BOOTSTRAP_SERVERS",
        show_envvar=True,
        required=True,
        help="Kafka bootstrap servers, host:port[,host:port].",
    )(func)
    return func


def control_topic_option(func: F) -> F:
    return click.option(
        "--control-topic", envvar="KMQ_CONTROL_TOPIC", show_envvar=True, default="kmq.control"
    )(func)
