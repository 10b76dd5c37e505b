"""The audit's logic: pure DataFrame-to-DataFrame functions, no I/O. docs/audit.md defines
every figure they compute.

Inputs are the two kinds of ``format("kmq")`` DataFrame (any subset of rows, at least the
columns in RECORD_COLUMNS and MARKER_COLUMNS). Queue records go through
:func:`queue_records` first.

Markers of one message share its id as their key, so they sit in one markers partition in
the order they were written: ``marker_offset`` orders them.

Aggregates are per queue; kmq.audit.summary adds them up into the overall figures, leaving
out dead-letter queues (whose records carry the ``kmq.dlq.origin`` header): a dead letter
is not a new send.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from kmq.markers import MarkerType

START, KEEPALIVE, END = MarkerType.START, MarkerType.KEEPALIVE, MarkerType.END
NACK, RELEASE, REDELIVERED = MarkerType.NACK, MarkerType.RELEASE, MarkerType.REDELIVERED
DEAD_LETTERED, REJECT, PROBE = MarkerType.DEAD_LETTERED, MarkerType.REJECT, MarkerType.PROBE
NO_DELIVERY_EVENT = (int(PROBE), int(MarkerType.WATCH))
"""Marker types that are no event of the record they name (a PROBE names none; a WATCH names
a copy the tracker watches)."""

SETTLING = (END, NACK, RELEASE, REJECT, REDELIVERED, DEAD_LETTERED)
"""Marker types that end a delivery (KEEPALIVE and unknown types do not)."""
GIVEBACK = (NACK, RELEASE, REJECT)
INVALID = -1
"""The ``type_id`` :func:`marker_type_counts` gives markers that could not be decoded."""

STATUSES = ("acked", "dead_lettered", "in_flight", "pending", "awaiting_redelivery", "lost")
"""Every sent message is in exactly one of these (see :func:`messages` for the rules)."""

CAUSES = {NACK: "nacked", RELEASE: "released", REJECT: "rejected"}
LEASE_EXPIRED = "lease_expired"

EXACT_BELOW_MS = 1000
BINS_PER_DECADE = 200

RECORD_COLUMNS = (
    "partition",
    "offset",
    "timestamp",
    "queue",
    "message_id",
    "attempt",
    "dead_letter_origin",
)
MARKER_COLUMNS = (
    "marker_offset",
    "timestamp",
    "type_id",
    "lane",
    "queue",
    "partition",
    "offset",
    "message_id",
    "attempt",
    "redeliver_after_ms",
    "reason",
    "error",
)


def _is(*types: MarkerType) -> Column:
    return F.col("type_id").isin(*[int(t) for t in types])


def queue_records(records: DataFrame, lane: int = 0) -> DataFrame:
    """The queue-record columns the audit uses, for records of one lane (0: the queue topic,
    1: the retry topic); ``dead_letter`` marks dead-letter copies."""
    return records.select(
        F.lit(lane).alias("lane"),
        "partition",
        "offset",
        "timestamp",
        "queue",
        "message_id",
        "attempt",
        F.col("dead_letter_origin").isNotNull().alias("dead_letter"),
    )


def dead_letter_queues(records: DataFrame) -> DataFrame:
    """``(queue)``: the queues holding dead letters (from :func:`queue_records`)."""
    return records.where(F.col("dead_letter")).select("queue").distinct()


def _not_dlq(dlqs: Sequence[str]) -> Column:
    return ~F.col("queue").isin(*dlqs) if dlqs else F.lit(True)


def marker_type_counts(markers: DataFrame) -> DataFrame:
    """``(type_id, markers)``: markers per type; undecodable ones count as INVALID."""
    kind = F.when(F.col("error").isNull(), F.col("type_id")).otherwise(F.lit(INVALID))
    return markers.groupBy(kind.alias("type_id")).agg(F.count(F.lit(1)).alias("markers"))


def delivery_markers(markers: DataFrame) -> DataFrame:
    """One row per delivered record ``(lane, partition, offset)`` that has valid markers
    (PROBE and WATCH markers are left out: :data:`NO_DELIVERY_EVENT`)."""
    m = markers.where(
        F.col("error").isNull()
        & F.col("type_id").isNotNull()
        & ~F.col("type_id").isin(*NO_DELIVERY_EVENT)
    ).select(
        F.coalesce(F.col("lane"), F.lit(0)).alias("lane"),
        "partition",
        "offset",
        "type_id",
        "reason",
        F.col("queue").alias("m_queue"),
        F.col("message_id").alias("m_message_id"),
        F.col("attempt").alias("m_attempt"),
        F.col("marker_offset").alias("pos"),
        F.unix_millis("timestamp").alias("ts"),
        "redeliver_after_ms",
    )
    start, redelivered = _is(START), _is(REDELIVERED)
    giveback, settling = _is(*GIVEBACK), _is(*SETTLING)
    return m.groupBy("lane", "partition", "offset").agg(
        F.max("m_queue").alias("m_queue"),
        F.max("m_message_id").alias("m_message_id"),
        F.max(F.when(start, F.col("m_attempt"))).alias("m_attempt"),
        F.count(F.when(start, 1)).alias("starts"),
        F.min(F.when(start, F.col("ts"))).alias("first_start_ms"),
        F.max(F.when(start, F.col("pos"))).alias("last_start_pos"),
        F.max(F.when(_is(START, KEEPALIVE), F.col("ts") + F.col("redeliver_after_ms"))).alias(
            "lease_until_ms"
        ),
        F.min(F.when(_is(END), F.col("ts"))).alias("end_ms"),
        F.count(F.when(_is(NACK), 1)).alias("nacks"),
        F.count(F.when(_is(RELEASE), 1)).alias("releases"),
        (F.count(F.when(_is(DEAD_LETTERED), 1)) > 0).alias("dead_lettered"),
        F.min(F.when(redelivered, F.col("ts"))).alias("redelivered_ms"),
        F.min(F.when(redelivered, F.col("pos"))).alias("redelivered_pos"),
        F.min_by(F.col("reason"), F.when(redelivered, F.col("pos"))).alias("redelivery_reason"),
        F.max(F.when(giveback, F.col("pos"))).alias("giveback_pos"),
        F.max_by(F.col("type_id"), F.when(giveback, F.col("pos"))).alias("giveback_type"),
        F.max(F.when(settling, F.col("pos"))).alias("last_settle_pos"),
        F.max_by(F.col("type_id"), F.when(settling, F.col("pos"))).alias("last_settle_type"),
    )


def deliveries(records: DataFrame, markers: DataFrame) -> DataFrame:
    """One row per queue record (``records`` from :func:`queue_records`), plus one per
    record that only markers name.

    Columns: queue, message_id, lane, partition, offset, attempt, on_queue, dead_letter (a
    dead-letter copy), sent_ms, starts, first_start_ms, end_ms, lease_until_ms, open
    (started, not settled since its last START), nacks, releases, dead_lettered,
    redelivered_ms, redelivered_pos, redelivery_reason, redelivery_cause, last_start_pos,
    last_settle_type, processing_ms (START to END), wait_ms (on the queue topic until START).
    """
    r = records.select(
        "lane",
        "partition",
        "offset",
        "queue",
        "message_id",
        "attempt",
        "dead_letter",
        F.unix_millis("timestamp").alias("sent_ms"),
        F.lit(True).alias("on_queue"),
    )
    d = r.join(delivery_markers(markers), ["lane", "partition", "offset"], "full_outer")
    starts = F.coalesce(F.col("starts"), F.lit(0))
    cause = (
        F.when(F.col("redelivered_pos").isNull(), F.lit(None))
        .when(
            F.col("giveback_pos") < F.col("redelivered_pos"),
            F.when(F.col("giveback_type") == int(NACK), CAUSES[NACK])
            .when(F.col("giveback_type") == int(REJECT), CAUSES[REJECT])
            .otherwise(CAUSES[RELEASE]),
        )
        .otherwise(F.lit(LEASE_EXPIRED))
    )
    return d.select(
        F.coalesce("queue", "m_queue", F.lit("")).alias("queue"),
        F.coalesce("message_id", "m_message_id").alias("message_id"),
        "lane",
        "partition",
        "offset",
        F.coalesce("attempt", "m_attempt").alias("attempt"),
        F.coalesce("on_queue", F.lit(False)).alias("on_queue"),
        F.coalesce("dead_letter", F.lit(False)).alias("dead_letter"),
        "sent_ms",
        starts.alias("starts"),
        "first_start_ms",
        "end_ms",
        "lease_until_ms",
        (
            (starts > 0)
            & (
                F.col("last_settle_pos").isNull()
                | (F.col("last_settle_pos") < F.col("last_start_pos"))
            )
        ).alias("open"),
        F.coalesce("nacks", F.lit(0)).alias("nacks"),
        F.coalesce("releases", F.lit(0)).alias("releases"),
        F.coalesce("dead_lettered", F.lit(False)).alias("dead_lettered"),
        "redelivered_ms",
        "redelivered_pos",
        "redelivery_reason",
        cause.alias("redelivery_cause"),
        "last_start_pos",
        "last_settle_type",
        (F.col("end_ms") - F.col("first_start_ms")).alias("processing_ms"),
        (F.col("first_start_ms") - F.col("sent_ms")).alias("wait_ms"),
    )


def messages(deliveries: DataFrame) -> DataFrame:
    """One row per message ``(queue, message_id)`` with its ``status``, the first that holds:
    ``acked`` (an END on any delivery); ``in_flight`` (its latest STARTed delivery is not
    settled); ``pending`` (a copy on the queue topic was never STARTed); ``dead_lettered``
    (a DEAD_LETTERED marker); ``awaiting_redelivery`` (its latest delivery was NACKed or
    RELEASEd and the tracker has not redelivered it yet); else ``lost``.

    ``sent`` is false for ids seen without an attempt-1 record (``orphans``).
    """
    started = F.col("starts") > 0
    original = F.col("on_queue") & (F.col("attempt") == 1)
    # The latest STARTed delivery's fields, one max_by each: a struct in an aggregation
    # buffer makes Spark sort the deliveries instead of hashing them (1-2 s of a 1M audit).
    # A message's markers share one markers partition, so its deliveries' last START
    # positions differ (unless the markers topic was repartitioned between them).
    latest = F.when(started, F.col("last_start_pos"))
    latest_fields = [
        F.max_by(F.col(name), latest).alias(f"latest_{name}")
        for name in ("open", "last_settle_type", "lease_until_ms", "first_start_ms", "attempt")
    ]
    g = deliveries.groupBy("queue", "message_id").agg(
        F.coalesce(F.max(original), F.lit(False)).alias("sent"),
        F.min(F.when(original, F.col("sent_ms"))).alias("sent_ms"),
        F.count(F.when(F.col("on_queue"), 1)).alias("copies"),
        F.count(F.when(F.col("on_queue") & ~started, 1)).alias("unstarted_copies"),
        F.count(F.when(started, 1)).alias("deliveries"),
        F.sum("starts").alias("starts"),
        F.count(F.col("end_ms")).alias("acked_deliveries"),
        F.min("end_ms").alias("acked_ms"),
        F.max("dead_lettered").alias("dead_lettered"),
        F.count(F.col("redelivered_pos")).alias("redeliveries"),
        F.max(F.when(started, F.col("attempt"))).alias("max_attempt"),
        *latest_fields,
    )
    status = (
        F.when(F.col("acked_deliveries") > 0, "acked")
        .when(F.col("latest_open"), "in_flight")
        .when(F.col("unstarted_copies") > 0, "pending")
        .when(F.col("dead_lettered"), "dead_lettered")
        .when(F.col("latest_last_settle_type").isin(*map(int, GIVEBACK)), "awaiting_redelivery")
        .otherwise("lost")
    )
    return g.select(
        "queue",
        "message_id",
        "sent",
        "sent_ms",
        "copies",
        "unstarted_copies",
        "deliveries",
        "starts",
        "acked_deliveries",
        "acked_ms",
        "dead_lettered",
        "redeliveries",
        "max_attempt",
        F.col("latest_first_start_ms").alias("latest_start_ms"),
        F.col("latest_lease_until_ms").alias("lease_until_ms"),
        "latest_attempt",
        status.alias("status"),
    )


def _count(cond: Column) -> Column:
    return F.count(F.when(cond, 1))


def queue_counts(messages: DataFrame, deliveries: DataFrame, as_of_ms: int) -> DataFrame:
    """``(queue, <counts>)``: the counts of docs/audit.md per queue (all additive, so the
    overall figures are sums), and first_sent_ms, last_event_ms, last_redelivered_ms."""
    sent = F.col("sent")
    overdue = (F.col("status") == "in_flight") & (F.col("lease_until_ms") < F.lit(as_of_ms))
    m = messages.groupBy("queue").agg(
        _count(sent).alias("sent"),
        *[_count(sent & (F.col("status") == s)).alias(s) for s in STATUSES],
        _count(sent & overdue).alias("in_flight_overdue"),
        _count(~sent).alias("orphans"),
        _count(F.col("deliveries") > 0).alias("messages_delivered"),
        F.coalesce(F.sum("starts"), F.lit(0)).alias("start_markers"),
        _count(F.col("redeliveries") > 0).alias("messages_redelivered"),
        _count(F.col("acked_deliveries") > 1).alias("acked_more_than_once"),
        F.min("sent_ms").alias("first_sent_ms"),
        F.max(F.greatest("sent_ms", "acked_ms")).alias("last_event_ms"),
    )
    d = deliveries.groupBy("queue").agg(
        _count(F.col("on_queue")).alias("queue_records"),
        _count(F.col("starts") > 0).alias("delivered"),
        _count(F.col("nacks") > 0).alias("nacked"),
        _count(F.col("releases") > 0).alias("released"),
        _count(F.col("redelivered_pos").isNotNull()).alias("redelivered"),
        F.max("redelivered_ms").alias("last_redelivered_ms"),
    )
    return m.join(d, "queue", "full_outer").select(
        "*",
        (F.col("start_markers") - F.col("messages_delivered")).alias("duplicate_deliveries"),
        (F.col("start_markers") - F.col("delivered")).alias("duplicate_starts"),
    )


def latency_values(deliveries: DataFrame, messages: DataFrame) -> DataFrame:
    """``(queue, metric, value_ms)``: processing_ms per START..END delivery, queue_wait_ms
    per started queue record, end_to_end_ms per acked message (first send to first END)."""
    processing = deliveries.select(
        "queue", F.lit("processing_ms").alias("metric"), F.col("processing_ms").alias("value_ms")
    )
    wait = deliveries.select(
        "queue", F.lit("queue_wait_ms").alias("metric"), F.col("wait_ms").alias("value_ms")
    )
    end_to_end = messages.where(F.col("sent")).select(
        "queue",
        F.lit("end_to_end_ms").alias("metric"),
        (F.col("acked_ms") - F.col("sent_ms")).alias("value_ms"),
    )
    return processing.unionByName(wait).unionByName(end_to_end).where(F.col("value_ms").isNotNull())


def latency_bin(value: Column) -> Column:
    """A value's bin: itself below EXACT_BELOW_MS, else one of BINS_PER_DECADE log bins
    per decade (``EXACT_BELOW_MS + k`` covers ``[10**(3 + k/B), 10**(3 + (k+1)/B))``)."""
    log_bin = F.lit(EXACT_BELOW_MS) + F.floor(
        (F.log10(value) - F.lit(math.log10(EXACT_BELOW_MS))) * BINS_PER_DECADE
    )
    return F.when(value < EXACT_BELOW_MS, value).otherwise(log_bin).cast("long")


def latency_bins(values: DataFrame) -> DataFrame:
    """``(metric, queue, bin, count, sum, max)`` of :func:`latency_values`: small enough to
    collect, and enough for exact counts, means and maxima, percentiles exact below
    EXACT_BELOW_MS and within one log bin (1.2 %) above, and the histograms."""
    v = F.col("value_ms")
    return values.groupBy("metric", "queue", latency_bin(v).alias("bin")).agg(
        F.count(v).alias("count"), F.sum(v).alias("sum"), F.max(v).alias("max")
    )


def attempts_histogram(messages: DataFrame) -> DataFrame:
    """``(queue, attempts, messages)``: delivered messages by their highest STARTed attempt."""
    return (
        messages.where(F.col("sent") & F.col("max_attempt").isNotNull())
        .groupBy("queue", F.col("max_attempt").alias("attempts"))
        .agg(F.count(F.lit(1)).alias("messages"))
    )


def redelivery_causes(deliveries: DataFrame) -> DataFrame:
    """``(queue, cause, redeliveries)``: lease_expired, nacked or released."""
    return (
        deliveries.where(F.col("redelivery_cause").isNotNull())
        .groupBy("queue", F.col("redelivery_cause").alias("cause"))
        .agg(F.count(F.lit(1)).alias("redeliveries"))
    )


def redelivery_reasons(deliveries: DataFrame, top: int) -> DataFrame:
    """``(queue, reason, redeliveries)``: the ``top`` commonest REDELIVERED reasons per queue."""
    counts = (
        deliveries.where(F.col("redelivered_pos").isNotNull())
        .groupBy("queue", F.coalesce("redelivery_reason", F.lit("")).alias("reason"))
        .agg(F.count(F.lit(1)).alias("redeliveries"))
    )
    rank = F.row_number().over(
        Window.partitionBy("queue").orderBy(F.desc("redeliveries"), F.asc("reason"))
    )
    return counts.withColumn("rank", rank).where(F.col("rank") <= top).drop("rank")


def activity_events(
    deliveries: DataFrame, messages: DataFrame, dlqs: Sequence[str] = ()
) -> DataFrame:
    """``(t, series)`` overall: when each message was sent and first acked, and when each
    redelivery happened (series ``redelivered_<cause>``)."""
    kept = messages.where(F.col("sent") & _not_dlq(dlqs))
    sent = kept.select(F.col("sent_ms").alias("t"), F.lit("sent").alias("series"))
    acked = kept.select(F.col("acked_ms").alias("t"), F.lit("acked").alias("series"))
    redelivered = deliveries.where(_not_dlq(dlqs)).select(
        F.col("redelivered_ms").alias("t"),
        F.concat(F.lit("redelivered_"), F.col("redelivery_cause")).alias("series"),
    )
    return sent.unionByName(acked).unionByName(redelivered).where(F.col("t").isNotNull())


def activity(events: DataFrame, bucket_ms: int) -> DataFrame:
    """``(bucket_ms, series, count)``: :func:`activity_events` counted per time bucket."""
    bucket = (F.floor(F.col("t") / bucket_ms) * bucket_ms).cast("long")
    return events.groupBy(bucket.alias("bucket_ms"), "series").agg(F.count(F.lit(1)).alias("count"))


def problems(messages: DataFrame, status: str, dlqs: Sequence[str] = ()) -> DataFrame:
    """Sent messages in ``status`` outside dead-letter queues, oldest first (by latest
    START, else by send time)."""
    since = F.coalesce(F.col("latest_start_ms"), F.col("sent_ms"))
    return (
        messages.where(F.col("sent") & (F.col("status") == status) & _not_dlq(dlqs))
        .select(
            "queue",
            "message_id",
            "latest_attempt",
            "deliveries",
            "sent_ms",
            since.alias("since_ms"),
            "lease_until_ms",
        )
        .orderBy("since_ms", "queue", "message_id")
    )
