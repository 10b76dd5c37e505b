"""``kmq-tracker``: run one tracker replica until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
from types import FrameType

import click

from kmq import logs
from kmq.cli.options import security_options, timeout_options
from kmq.errors import KmqError
from kmq.kafka_clients import KafkaSecurity
from tracker.config import TrackerConfig


@click.command(context_settings={"show_default": True, "max_content_width": 100})
@click.option(
    "--bootstrap-servers",
    envvar="KMQ_BOOTSTRAP_SERVERS",
    show_envvar=True,
    required=True,
    help="Kafka bootstrap servers, host:port[,host:port].",
)
@click.option("--queue-topic", envvar="KMQ_QUEUE_TOPIC", show_envvar=True, default="kmq.queue")
@click.option("--marker-topic", envvar="KMQ_MARKER_TOPIC", show_envvar=True, default="kmq.markers")
@click.option(
    "--control-topic", envvar="KMQ_CONTROL_TOPIC", show_envvar=True, default="kmq.control"
)
@click.option(
    "--retry-topic",
    envvar="KMQ_RETRY_TOPIC",
    show_envvar=True,
    default="",
    help="Where redelivered copies go (consumers read it before the queue topic); "
    "default <queue-topic>.retry.",
)
@click.option(
    "--group-id",
    envvar="KMQ_GROUP_ID",
    show_envvar=True,
    default="kmq-tracker",
    help="Consumer group shared by all replicas.",
)
@click.option(
    "--default-redelivery-timeout-s",
    envvar="KMQ_DEFAULT_REDELIVERY_TIMEOUT_S",
    show_envvar=True,
    type=float,
    default=30.0,
    help="Lease for markers whose own is missing or absurd.",
)
@timeout_options
@click.option(
    "--rebalance",
    envvar="KMQ_REBALANCE",
    show_envvar=True,
    type=click.Choice(["cooperative", "eager"]),
    default="eager",
    help="eager (sticky): every replica gives up every partition at every rebalance but "
    "keeps reading it (redelivering nothing) until the next assignment, which mostly gives it "
    "back. cooperative: only what must move moves (not yet the default; see the README).",
)
@click.option(
    "--commit-interval-s", envvar="KMQ_COMMIT_INTERVAL_S", show_envvar=True, type=float, default=1.0
)
@click.option(
    "--stats-interval-s", envvar="KMQ_STATS_INTERVAL_S", show_envvar=True, type=float, default=30.0
)
@click.option(
    "--max-redeliveries-per-round",
    envvar="KMQ_MAX_REDELIVERIES_PER_ROUND",
    show_envvar=True,
    type=click.IntRange(min=1),
    default=TrackerConfig.max_redeliveries_per_round,
    help="Most deliveries one loop turn redelivers (those due longest first).",
)
@click.option(
    "--max-message-bytes",
    envvar="KMQ_MAX_MESSAGE_BYTES",
    show_envvar=True,
    type=int,
    default=1_000_000,
    help="The SDK's max_message_bytes: the largest message the tracker must redeliver.",
)
@click.option(
    "--transactional/--no-transactional",
    envvar="KMQ_TRANSACTIONAL",
    default=None,
    hidden=True,
    help="Accepted for kmq 0.1 deployments and ignored: every round is a transaction now.",
)
@click.option(
    "--metrics-port",
    envvar="KMQ_METRICS_PORT",
    show_envvar=True,
    type=int,
    default=0,
    help="Serve /metrics (Prometheus), /healthz and /readyz on this port; 0: off.",
)
@click.option(
    "--liveness-timeout-s",
    envvar="KMQ_LIVENESS_TIMEOUT_S",
    show_envvar=True,
    type=float,
    default=60.0,
    help="/healthz fails once the run loop has not turned for this long.",
)
@click.option(
    "--stalled-after-s",
    envvar="KMQ_STALLED_AFTER_S",
    show_envvar=True,
    type=float,
    default=30.0,
    help="Report a markers partition whose reading stands still below its high watermark "
    "this long (a transaction the broker has not ended): an ERROR line, /readyz fails.",
)
@click.option(
    "--unread-copy-s",
    envvar="KMQ_UNREAD_COPY_S",
    show_envvar=True,
    type=float,
    default=2.0,
    help="Copy again, toward a live consumer, a copy nobody took this long after it was "
    "written whose retry partition no consumer reads any more (a duplicate once that one "
    "is read after all); 0: never.",
)
@click.option(
    "--tick-interval-s",
    envvar="KMQ_TICK_INTERVAL_S",
    show_envvar=True,
    type=float,
    default=0.25,
    help="How often an owner marks its markers partitions, so that after a fail-over its "
    "successor runs the leases it replays from when their markers were written (to within "
    "about three of these) rather than afresh; 0: never (and no beacons either).",
)
@click.option(
    "--adopt-after-s",
    envvar="KMQ_ADOPT_AFTER_S",
    show_envvar=True,
    type=float,
    default=2.0,
    help="Take up a markers partition whose owner's beacons have not been read for this "
    "long, until the group's next assignment, rather than wait out the owner's session "
    "and a rebalance (the claim fences the owner); 0: never.",
)
@click.option(
    "--log-level",
    envvar="KMQ_LOG_LEVEL",
    show_envvar=True,
    default="INFO",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="KMQ_LOG_FORMAT",
    show_envvar=True,
    default="text",
    type=click.Choice(logs.FORMATS),
    help="text, or one JSON object per line.",
)
@security_options
def main(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    control_topic: str,
    retry_topic: str,
    group_id: str,
    default_redelivery_timeout_s: float,
    session_timeout_ms: int,
    rebalance: str,
    commit_interval_s: float,
    stats_interval_s: float,
    max_redeliveries_per_round: int,
    max_message_bytes: int,
    transactional: bool | None,
    request_timeout_ms: int,
    metrics_port: int,
    liveness_timeout_s: float,
    stalled_after_s: float,
    unread_copy_s: float,
    tick_interval_s: float,
    adopt_after_s: float,
    log_level: str,
    log_format: str,
    security: KafkaSecurity,
) -> None:
    """Track kmq markers and redeliver messages whose lease ran out."""
    logs.configure(log_format, log_level)
    try:
        config = TrackerConfig(
            bootstrap_servers=bootstrap_servers,
            queue_topic=queue_topic,
            marker_topic=marker_topic,
            control_topic=control_topic,
            retry_topic=retry_topic,
            group_id=group_id,
            default_redelivery_timeout_s=default_redelivery_timeout_s,
            session_timeout_ms=session_timeout_ms,
            rebalance=rebalance,
            commit_interval_s=commit_interval_s,
            stats_interval_s=stats_interval_s,
            max_redeliveries_per_round=max_redeliveries_per_round,
            max_message_bytes=max_message_bytes,
            security=security,
            request_timeout_ms=request_timeout_ms,
            metrics_port=metrics_port,
            liveness_timeout_s=liveness_timeout_s,
            stalled_after_s=stalled_after_s,
            unread_copy_s=unread_copy_s,
            tick_interval_s=tick_interval_s,
            adopt_after_s=adopt_after_s,
        )
    except KmqError as exc:
        raise click.UsageError(str(exc)) from exc
    if transactional is not None:
        logging.getLogger("kmq.tracker").warning(
            "--transactional is ignored: every redelivery round is a fenced transaction"
        )
    from tracker.daemon import Tracker

    try:
        tracker = Tracker(config)  # connects in run(), retrying until Kafka answers
    except KmqError as exc:  # one line, no traceback
        raise click.ClickException(str(exc)) from exc

    def on_signal(signum: int, frame: FrameType | None) -> None:
        tracker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        tracker.run()
    except KmqError as exc:  # the metrics port is taken, say
        raise click.ClickException(str(exc)) from exc
