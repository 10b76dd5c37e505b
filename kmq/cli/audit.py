"""``kmq audit``: the PySpark job that checks every message's fate from the topics."""

from __future__ import annotations

from pathlib import Path

import click

from kmq.cli.options import connection_options
from kmq.kafka_clients import KafkaSecurity

EXIT_CHECK_FAILED = 3


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=what)
        out[key.strip()] = value
    return out


def _spark_security(security: KafkaSecurity) -> dict[str, str]:
    from kmq.errors import KmqError

    try:
        return security.spark_options()
    except KmqError as exc:
        raise click.UsageError(str(exc)) from exc


@click.command()
@connection_options
@click.option(
    "--output",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for summary.json and report.html.",
)
@click.option(
    "--master",
    default=None,
    help="Spark master URL, e.g. spark://host:7077 [default: local[*], or spark-submit's].",
)
@click.option("--queue", "queues", multiple=True, help="Audit only this queue (repeatable).")
@click.option(
    "--check",
    type=click.Choice(["none", "no-loss", "settled"]),
    default="none",
    help="Exit with status 3 unless no message is lost (no-loss), or unless every sent "
    "message is acked or dead-lettered (settled).",
)
@click.option("--samples", type=click.IntRange(0, 10_000), default=20,
              help="List this many of the oldest unsettled messages per status.")  # fmt: skip
@click.option("--max-records-per-split", type=click.IntRange(1000), default=1_000_000)
@click.option("--no-html", is_flag=True, help="Write summary.json only.")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Spark setting.")
@click.option("--kafka", "kafkas", multiple=True, metavar="KEY=VALUE",
              help="kafka-python setting, e.g. security_protocol=SSL.")  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@click.option("--follow", is_flag=True,
              help="Keep auditing as a streaming job; rewrite outputs every trigger.")  # fmt: skip
@click.option("--checkpoint", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="--follow: resume from here [default: OUTPUT/checkpoint].")  # fmt: skip
@click.option("--trigger-s", type=click.FloatRange(0.1), default=5.0, show_default=True,
              help="--follow: seconds between micro-batches and refreshes.")  # fmt: skip
@click.option("--stuck-leases", type=click.FloatRange(0.1), default=3.0, show_default=True,
              help="--follow: flag messages in flight longer than this many leases.")  # fmt: skip
@click.option("--pending-bound-s", type=click.FloatRange(0.1), default=60.0, show_default=True,
              help="--follow: flag a message not started this long after it was sent.")  # fmt: skip
@click.option("--window-s", type=click.FloatRange(1), default=300.0, show_default=True,
              help="--follow: the trailing window of counts and percentiles.")  # fmt: skip
@click.option("--settled-horizon-s", type=click.FloatRange(0), default=60.0, show_default=True,
              help="--follow: how long a settled message stays in the state.")  # fmt: skip
@click.option("--max-records-per-trigger", type=click.IntRange(1), default=200_000,
              show_default=True, help="--follow: admission control per topic.")  # fmt: skip
@click.option("--prometheus", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="--follow: also write Prometheus metrics to this file.")  # fmt: skip
def audit(
    bootstrap_servers: str,
    queue_topic: str,
    marker_topic: str,
    security: KafkaSecurity,
    output: Path,
    master: str | None,
    queues: tuple[str, ...],
    check: str,
    samples: int,
    max_records_per_split: int,
    no_html: bool,
    confs: tuple[str, ...],
    kafkas: tuple[str, ...],
    quiet: bool,
    follow: bool,
    checkpoint: Path | None,
    trigger_s: float,
    stuck_leases: float,
    pending_bound_s: float,
    window_s: float,
    settled_horizon_s: float,
    max_records_per_trigger: int,
    prometheus: Path | None,
) -> None:
    """Audit the queue and markers topics with PySpark: was every message processed?

    Writes OUTPUT/summary.json (machine-readable) and OUTPUT/report.html. Runs on a local
    Spark session unless --master (or spark-submit) says otherwise. With --follow it keeps
    running as a streaming job, flags stuck messages and rewrites the outputs every trigger.
    """
    # Spark is imported here, not at module import: `kmq --help` stays fast without it.
    try:
        from kmq.audit.job import AuditConfig, run_audit
        from kmq.audit.summary import check_failures
        from kmq.spark.session import get_session
    except ImportError as exc:
        raise click.ClickException(
            f"kmq audit needs the spark extra: pip install 'kmq[spark]' ({exc})"
        ) from exc
    from kmq.errors import KmqError

    kafka = {**_spark_security(security), **_pairs(kafkas, "--kafka")}

    def say(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    if follow:
        from kmq.audit.follow import FollowConfig, run_follow

        follow_config = FollowConfig(
            bootstrap_servers=bootstrap_servers,
            output=output,
            checkpoint=checkpoint,
            queue_topic=queue_topic,
            marker_topic=marker_topic,
            queues=queues,
            trigger_s=trigger_s,
            stuck_leases=stuck_leases,
            pending_bound_s=pending_bound_s,
            window_s=window_s,
            settled_horizon_s=settled_horizon_s,
            max_records_per_trigger=max_records_per_trigger,
            html=not no_html,
            prometheus=prometheus,
            kafka=kafka,
        )
        say("starting Spark ...")
        spark = get_session(master, app_name="kmq-audit-follow", conf=_pairs(confs, "--conf"))
        try:
            run_follow(spark, follow_config, say)
        except KeyboardInterrupt:
            say("stopped")
        except KmqError as exc:
            raise click.ClickException(str(exc)) from exc
        return

    config = AuditConfig(
        bootstrap_servers=bootstrap_servers,
        output=output,
        queue_topic=queue_topic,
        marker_topic=marker_topic,
        queues=queues,
        max_records_per_split=max_records_per_split,
        samples=samples,
        html=not no_html,
        # The security settings reach every Spark-side client as kafka.<setting> options;
        # an explicit --kafka setting wins.
        kafka=kafka,
    )

    say("starting Spark ...")
    spark = get_session(master, app_name="kmq-audit", conf=_pairs(confs, "--conf"))
    say(f"Spark {spark.version}, master {spark.sparkContext.master}")
    try:
        summary = run_audit(spark, config, say)
    except KmqError as exc:
        raise click.ClickException(str(exc)) from exc
    o = summary["overall"]
    click.echo(
        f"sent={o['sent']} acked={o['acked']} dead_lettered={o['dead_lettered']} "
        f"in_flight={o['in_flight']} pending={o['pending']} "
        f"awaiting_redelivery={o['awaiting_redelivery']} lost={o['lost']} "
        f"redelivered={o['redelivered']} duplicate_deliveries={o['duplicate_deliveries']}"
    )
    click.echo(f"wrote {output / 'summary.json'}" + ("" if no_html else " and report.html"))
    failures = check_failures(summary, check)
    if failures:
        click.echo(f"check {check} failed: " + "; ".join(failures), err=True)
        raise SystemExit(EXIT_CHECK_FAILED)
