"""The chaos ledger check on hand-made runs: each verdict the chaos test asserts can fail."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kmq.markers import Marker, MarkerType
from tests.chaos.ledger import (
    Incarnation,
    Ledgers,
    MarkerLog,
    MarkerRecord,
    QueueLog,
    QueueRecord,
    Reads,
    Report,
    RunLog,
    WorkerEvent,
    check,
    lost_behind,
    read_ledgers,
)
from tests.chaos.proxy import Fault
from tests.chaos.roles import NACK_REASON
from tracker.state import UNREAD_REASON

LEASE_S = 2.0
T0 = 1_800_000_000.0
MID = "m" * 32
RECORD = (0, 1, 7)
AHEAD_S, BEHIND_S = 300.0, -300.0


def worker(name: str, skew_s: float, killed: float | None = None) -> Incarnation:
    return Incarnation(name, "worker", 0, skew_s, started=T0, killed=killed)


def marker(
    kind: MarkerType, ts: float, *, attempt: int = 1, reason: str = "", offset: int = 0
) -> MarkerRecord:
    m = Marker(
        type=kind,
        queue="q0",
        partition=RECORD[1],
        offset=RECORD[2],
        message_id=MID,
        attempt=attempt,
        reason=reason,
    )
    return MarkerRecord(0, offset, ts, m, MID)


def event(
    kind: str, who: str, t: float, attempt: int = 1, where: tuple[int, int, int] = RECORD
) -> WorkerEvent:
    return WorkerEvent(kind, who, t, MID, "q0", attempt, where)


def run_check(
    incarnations: list[Incarnation],
    events: list[WorkerEvent],
    markers: list[MarkerRecord],
    faults: tuple[Fault, ...] = (),
    run_s: float = 60.0,
    reads: tuple[Reads, ...] = (),
) -> Report:
    run = RunLog(
        seed=1,
        lease_s=LEASE_S,
        fault_grace_s=1.0,
        started=T0,
        finished=T0 + run_s,
        incarnations=incarnations,
        faults=list(faults),
    )
    log = MarkerLog()
    for record in markers:
        log.records.append(record)
        if record.marker.type is MarkerType.END:
            log.settled.add(MID)
    return check(run, Ledgers(sent={MID: T0}, events=events, reads=list(reads)), log, QueueLog())


def test_acked_message_is_settled() -> None:
    report = run_check(
        [worker("w0.1", AHEAD_S)],
        [event("took", "w0.1", T0 + 1), event("acked", "w0.1", T0 + 1.1)],
        [marker(MarkerType.START, T0 + 1 + AHEAD_S), marker(MarkerType.END, T0 + 1.1 + AHEAD_S)],
    )
    assert (report.lost, report.acked_without_end, report.redeliveries) == ([], [], 0)
    assert report.skewed_markers == (2, 0)


def test_skew_is_seen_early_in_a_long_run() -> None:
    # Stamped 300 s ahead, written an hour before the run ended: ahead of when it was written.
    report = run_check(
        [worker("w0.1", AHEAD_S)],
        [event("took", "w0.1", T0 + 1), event("acked", "w0.1", T0 + 1.1)],
        [marker(MarkerType.START, T0 + 1 + AHEAD_S), marker(MarkerType.END, T0 + 1.1 + AHEAD_S)],
        run_s=3600,
    )
    assert report.skewed_markers == (2, 0)


def test_unskewed_markers_are_not_counted_skewed() -> None:
    # Taken 50 s after it was sent (a backlog), acked 30 s later: no stamp is off.
    report = run_check(
        [worker("w0.1", 0.0)],
        [event("took", "w0.1", T0 + 50), event("acked", "w0.1", T0 + 80)],
        [marker(MarkerType.START, T0 + 49), marker(MarkerType.END, T0 + 79)],
        run_s=3600,
    )
    assert report.skewed_markers == (0, 0)


def test_message_without_end_is_lost() -> None:
    report = run_check([worker("w0.1", 0.0)], [], [marker(MarkerType.START, T0 + 1)])
    assert report.lost == [MID]


def test_lost_messages_are_counted_behind_a_stop_only_from_its_offset_on() -> None:
    def start(message_id: str, partition: int, offset: int) -> MarkerRecord:
        return replace(marker(MarkerType.START, T0, offset=offset), message_id=message_id,
                       partition=partition)  # fmt: skip

    records = [start("a", 0, 99), start("b", 0, 100), start("c", 1, 500), start("d", 0, 7)]
    stops = {0: (100, 900)}  # partition 1 was read to its end
    assert lost_behind(["a", "b", "c"], records, stops) == {"b"}
    assert lost_behind(["a", "c", "d"], records, stops) == set()
    assert lost_behind(["b"], records, {}) == set()


def test_ack_without_end_marker_is_reported() -> None:
    report = run_check([worker("w0.1", 0.0)], [event("acked", "w0.1", T0 + 1)], [])
    assert report.acked_without_end == [MID]


@pytest.mark.skipif("DEAD_LETTERED" not in MarkerType.__members__, reason="no dead letters yet")
def test_dead_lettered_message_is_settled() -> None:
    log_markers = [
        marker(MarkerType.START, T0 + 1),
        marker(MarkerType["DEAD_LETTERED"], T0 + 4, reason=NACK_REASON),
    ]
    run = RunLog(1, LEASE_S, 1.0, T0, T0 + 60, [worker("w0.1", 0.0)], [])
    log = MarkerLog()
    for record in log_markers:
        log.records.append(record)
    log.settled.add(MID)  # what MarkerLog.add does for a DEAD_LETTERED record
    report = check(
        run,
        Ledgers(sent={MID: T0}, events=[event("nacked", "w0.1", T0 + 2)]),
        log,
        QueueLog(),
    )
    assert report.lost == []
    assert report.dead_lettered == 1


def test_redelivery_after_the_holder_was_killed_is_explained_and_timed() -> None:
    report = run_check(
        [worker("w0.1", AHEAD_S, killed=T0 + 2), worker("w1.1", BEHIND_S)],
        [event("took", "w0.1", T0 + 1), event("took", "w1.1", T0 + 5, attempt=2)],
        [
            marker(MarkerType.START, T0 + 1 + AHEAD_S),
            marker(MarkerType.REDELIVERED, T0 + 4.5, attempt=2, reason="lease expired"),
        ],
    )
    assert report.causes == {"holder_killed": 1}
    assert (report.unexplained, report.early) == ([], [])
    assert report.delays_beyond_lease_s == [pytest.approx(5 - 2 - LEASE_S)]
    # Split at the REDELIVERED marker: the tracker's part, then the consumers'.
    assert report.tracker_delays_s == [pytest.approx(4.5 - 2 - LEASE_S)]
    assert report.consumer_delays_s == [pytest.approx(5 - 4.5)]
    assert "consumer part p50=0.50s" in report.summary("")
    assert report.duplicates == 1


def test_redelivery_of_a_silent_holder_is_blamed_on_it() -> None:
    # No marker from the holder for a whole lease: a starved worker, not a kmq fault.
    report = run_check(
        [worker("w0.1", 0.0)],
        [event("took", "w0.1", T0 + 1), event("acked", "w0.1", T0 + 5)],
        [
            marker(MarkerType.START, T0 + 1),
            marker(MarkerType.REDELIVERED, T0 + 3.5, attempt=2, reason="lease expired"),
        ],
    )
    assert report.causes == {"holder_silent": 1}
    assert report.unexplained == [] and len(report.overload) == 1


def test_redelivery_despite_a_recent_keepalive_is_blamed_on_tracker_lag() -> None:
    report = run_check(
        [worker("w0.1", AHEAD_S)],
        [event("took", "w0.1", T0 + 1), event("acked", "w0.1", T0 + 5)],
        [
            marker(MarkerType.START, T0 + 1 + AHEAD_S),
            marker(MarkerType.KEEPALIVE, T0 + 2.5 + AHEAD_S),
            marker(MarkerType.REDELIVERED, T0 + 3.5, attempt=2, reason="lease expired"),
        ],
    )
    assert report.causes == {"tracker_lag": 1}


def test_a_holder_late_with_its_keepalive_is_blamed_not_the_tracker() -> None:
    # Quiet for more than a lease after its START, then a KEEPALIVE just before the
    # redelivery: the lease had run out on the holder's side (it was starved), so the
    # tracker, which acts only on what it has read, is not to blame.
    report = run_check(
        [worker("w0.1", 0.0)],
        [event("took", "w0.1", T0 + 1), event("acked", "w0.1", T0 + 5)],
        [
            marker(MarkerType.START, T0 + 1),
            marker(MarkerType.KEEPALIVE, T0 + 3.2),
            marker(MarkerType.REDELIVERED, T0 + 3.5, attempt=2, reason="lease expired"),
        ],
    )
    assert report.causes == {"holder_silent": 1}


def test_redelivery_of_a_delivery_nobody_started_is_unexplained() -> None:
    report = run_check(
        [worker("w0.1", 0.0)],
        [],
        [marker(MarkerType.REDELIVERED, T0 + 3.5, attempt=2, reason="lease expired")],
    )
    assert report.causes == {"unexplained": 1}
    assert len(report.unexplained) == 1


def test_redelivery_during_a_stall_is_explained_by_it() -> None:
    report = run_check(
        [worker("w0.1", 0.0)],
        [event("took", "w0.1", T0 + 1), event("acked", "w0.1", T0 + 5)],
        [
            marker(MarkerType.START, T0 + 1),
            marker(MarkerType.REDELIVERED, T0 + 3.5, attempt=2, reason="lease expired"),
        ],
        faults=(Fault("stall", T0 + 1.2, T0 + 3.9, 10, True),),
    )
    assert report.causes == {"fault": 1}


def test_redelivery_before_the_lease_ran_out_is_early() -> None:
    # What a tracker trusting a slow clock would do: the START claims to be 300 s old.
    report = run_check(
        [worker("w0.1", BEHIND_S, killed=T0 + 1.2)],
        [event("took", "w0.1", T0 + 1)],
        [
            marker(MarkerType.START, T0 + 1 + BEHIND_S),
            marker(MarkerType.REDELIVERED, T0 + 1.5, attempt=2, reason="lease expired"),
        ],
    )
    assert len(report.early) == 1
    assert report.skewed_markers == (0, 1)


def test_nack_redelivery_needs_the_nack() -> None:
    markers = [
        marker(MarkerType.START, T0 + 1),
        marker(MarkerType.NACK, T0 + 1.1, reason=NACK_REASON),
        marker(MarkerType.REDELIVERED, T0 + 1.2, attempt=2, reason=NACK_REASON),
    ]
    took = event("took", "w0.1", T0 + 1)
    nacked = run_check([worker("w0.1", 0.0)], [took, event("nacked", "w0.1", T0 + 1.1)], markers)
    assert nacked.causes == {"nacked": 1}
    # Killed right after nack() returned: no ledger line, but the NACK marker is there.
    killed = run_check([worker("w0.1", 0.0, killed=T0 + 1.15)], [took], markers)
    assert killed.causes == {"nacked": 1}
    unknown = run_check([worker("w0.1", 0.0)], [took], [markers[0], markers[2]])
    assert unknown.causes == {"unexplained": 1}


def test_second_redelivery_of_a_delivery_needs_a_tracker_kill_or_fault() -> None:
    markers = [
        marker(MarkerType.START, T0 + 1),
        marker(MarkerType.NACK, T0 + 1.1),
        marker(MarkerType.REDELIVERED, T0 + 1.2, attempt=2, reason=NACK_REASON),
        marker(MarkerType.REDELIVERED, T0 + 30, attempt=2, reason=NACK_REASON),
    ]
    events = [event("took", "w0.1", T0 + 1), event("nacked", "w0.1", T0 + 1.1)]
    report = run_check([worker("w0.1", 0.0)], events, markers)
    assert report.causes == {"nacked": 1, "unexplained": 1}
    tracker = Incarnation("t0.1", "tracker", 0, 0.0, started=T0, killed=T0 + 20)
    report = run_check([worker("w0.1", 0.0), tracker], events, markers)
    assert report.causes == {"nacked": 1, "repeat": 1}


def test_a_second_redelivery_for_a_nacked_duplicate_of_the_record_is_explained() -> None:
    # After the first redelivery the record was read again (its first reader's offset commit
    # never landed), a duplicate START of the same delivery, and that delivery was nacked.
    markers = [
        marker(MarkerType.START, T0 + 1),
        marker(MarkerType.NACK, T0 + 1.1),
        marker(MarkerType.REDELIVERED, T0 + 1.2, attempt=2, reason=NACK_REASON),
        marker(MarkerType.START, T0 + 25),
        marker(MarkerType.NACK, T0 + 25.1),
        marker(MarkerType.REDELIVERED, T0 + 30, attempt=2, reason=NACK_REASON),
    ]
    first = [event("took", "w0.1", T0 + 1), event("nacked", "w0.1", T0 + 1.1)]
    again = [event("took", "w1.1", T0 + 25), event("nacked", "w1.1", T0 + 25.1)]
    workers = [worker("w0.1", 0.0), worker("w1.1", 0.0)]
    assert run_check(workers, first + again, markers).causes == {"nacked": 1, "renacked": 1}
    # Taken again but acked, not nacked: nothing explains a second nack redelivery.
    acked = [again[0], event("acked", "w1.1", T0 + 25.1)]
    assert run_check(workers, first + acked, markers).causes == {"nacked": 1, "unexplained": 1}


def test_a_second_lease_of_a_record_read_again_is_explained_like_the_first() -> None:
    # Reduced chaos run, seed 1273005805: w0.1 STARTed the record and died before handing it
    # out, and the tracker redelivered that lease. w1.1, the partition's next owner, read the
    # record again (w0.1's offset commit never landed), STARTed it and died before handing it
    # out too: a second lease of the same delivery, which ran out and was redelivered again,
    # with no tracker kill or fault in between. w2.1 then read it a third time and acked it.
    workers = [
        worker("w0.1", AHEAD_S, killed=T0 + 1.5),
        worker("w1.1", BEHIND_S, killed=T0 + 4),
        worker("w2.1", 0.0),
    ]
    events = [event("took", "w2.1", T0 + 7), event("acked", "w2.1", T0 + 7.1)]
    markers = [
        marker(MarkerType.START, T0 + 1 + AHEAD_S, offset=1),
        marker(MarkerType.REDELIVERED, T0 + 3.2, attempt=2, reason="lease expired", offset=2),
        marker(MarkerType.START, T0 + 3.5 + BEHIND_S, offset=3),
        marker(MarkerType.REDELIVERED, T0 + 5.6, attempt=2, reason="lease expired", offset=4),
        marker(MarkerType.START, T0 + 6.9, offset=5),
        marker(MarkerType.END, T0 + 7.1, offset=6),
    ]
    report = run_check(workers, events, markers)
    assert report.causes == {"buffered_killed": 2}
    assert report.unexplained == [] and report.early == []
    # The same second START before the first REDELIVERED in the log: the tracker read it
    # while the first lease was being redelivered (one lease covers both), so nothing
    # explains a second redelivery.
    folded = [markers[0], markers[2], markers[1], markers[3], markers[4], markers[5]]
    folded = [replace(m, offset=i) for i, m in enumerate(folded, 1)]
    assert run_check(workers, events, folded).causes == {"buffered_killed": 1, "unexplained": 1}
    # The second lease redelivered less than a lease after its START: early.
    hasty = [*markers[:3], replace(markers[3], timestamp_s=T0 + 4.5), *markers[4:]]
    assert len(run_check(workers, events, hasty).early) == 1
    # Its starter alive and writing: the tracker lagged, not explained by a kill.
    alive = [worker("w0.1", AHEAD_S, killed=T0 + 1.5), worker("w1.1", BEHIND_S), workers[2]]
    kept = [*markers[:3], marker(MarkerType.KEEPALIVE, T0 + 4.5 + BEHIND_S), *markers[3:]]
    kept = [replace(m, offset=i) for i, m in enumerate(kept, 1)]
    lagged = run_check(alive, [event("took", "w1.1", T0 + 3.5), *events], kept)
    assert lagged.causes == {"buffered_killed": 1, "tracker_lag": 1}


def test_redelivery_of_a_buffered_message_is_explained_by_the_kill_of_its_starter() -> None:
    # w0.1 STARTed it and died before handing it out; w1.1 re-read the record (its offset was
    # never committed) after the redelivery: w1.1 was not holding it when the lease ran out.
    report = run_check(
        [worker("w0.1", AHEAD_S, killed=T0 + 2), worker("w1.1", BEHIND_S)],
        [event("took", "w1.1", T0 + 10), event("acked", "w1.1", T0 + 10.1)],
        [
            marker(MarkerType.START, T0 + 1 + AHEAD_S),
            marker(MarkerType.REDELIVERED, T0 + 4, attempt=2, reason="lease expired"),
            marker(MarkerType.START, T0 + 10 + BEHIND_S),
        ],
    )
    assert report.causes == {"buffered_killed": 1}
    assert report.early == []


def test_a_buffered_lease_explains_a_copy_sent_while_the_next_owner_held_the_record() -> None:
    # w0.1 STARTed it and died before handing it out; the partition's next owner w1.1 read
    # the record again, STARTed, took and acked it, while the tracker, already redelivering
    # w0.1's expired lease, wrote the copy: not a tracker that lagged behind w1.1's END.
    workers = [worker("w0.1", AHEAD_S, killed=T0 + 2), worker("w1.1", BEHIND_S)]
    events = [event("took", "w1.1", T0 + 9.1), event("acked", "w1.1", T0 + 9.5)]
    markers = [
        marker(MarkerType.START, T0 + 1 + AHEAD_S),
        marker(MarkerType.START, T0 + 9 + BEHIND_S),
        marker(MarkerType.REDELIVERED, T0 + 10, attempt=2, reason="lease expired"),
    ]
    report = run_check(workers, events, markers)
    assert report.causes == {"buffered_killed": 1}
    assert report.overload == [] and report.early == []
    # Without the killed worker's START, the same copy is the tracker's lag.
    lagged = run_check(workers, events, [markers[1], markers[2]])
    assert lagged.causes == {"tracker_lag": 1} and len(lagged.overload) == 1


def test_a_holders_own_start_is_not_taken_for_a_killed_workers() -> None:
    # w0.1 and w1.1 share a clock: w1.1's START could be read as w0.1's, who was alive then
    # and killed before the copy. A holder that may have written it keeps the blame.
    workers = [worker("w0.1", 0.0, killed=T0 + 9.8), worker("w1.1", 0.0)]
    events = [event("took", "w1.1", T0 + 9.1), event("acked", "w1.1", T0 + 9.5)]
    markers = [
        marker(MarkerType.START, T0 + 9),
        marker(MarkerType.REDELIVERED, T0 + 11.2, attempt=2, reason="lease expired"),
    ]
    assert run_check(workers, events, markers).causes == {"tracker_lag": 1}


def test_a_buffered_redelivery_is_timed_from_its_true_starters_kill() -> None:
    # w1.2 (300 s behind) STARTed it at T0 + 601 and died at T0 + 602. Its START's stamp,
    # T0 + 301, read with w0.1's skew (300 s ahead) points at T0 + 1, when w0.1 (killed at
    # T0 + 2) was alive too: but the message was only sent at T0 + 600, so w0.1 cannot have
    # started it, and its kill is no part of the delay.
    report = run_check_sent(
        [
            worker("w0.1", AHEAD_S, killed=T0 + 2),
            Incarnation("w1.2", "worker", 1, BEHIND_S, started=T0 + 500, killed=T0 + 602),
        ],
        [event("took", "w0.2", T0 + 606, attempt=2)],
        [
            marker(MarkerType.START, T0 + 601 + BEHIND_S),
            marker(MarkerType.REDELIVERED, T0 + 604.5, attempt=2, reason="lease expired"),
        ],
        sent_at=T0 + 600,
        extra=[Incarnation("w0.2", "worker", 0, AHEAD_S, started=T0 + 3)],
    )
    assert report.causes == {"buffered_killed": 1}
    assert report.delays_beyond_lease_s == [pytest.approx(606 - 602 - LEASE_S)]


def run_check_sent(
    incarnations: list[Incarnation],
    events: list[WorkerEvent],
    markers: list[MarkerRecord],
    *,
    sent_at: float,
    extra: list[Incarnation],
) -> Report:
    run = RunLog(1, LEASE_S, 1.0, T0, T0 + 900, [*incarnations, *extra], [])
    log = MarkerLog()
    log.records.extend(markers)
    return check(run, Ledgers(sent={MID: sent_at}, events=events), log, QueueLog())


def test_queue_record_skew_is_measured_against_its_send() -> None:
    other = "n" * 32
    queue = QueueLog()
    queue.records += [
        QueueRecord(0, 0, T0 + 10 + 240, MID, 1),  # producer 240 s ahead
        QueueRecord(0, 1, T0 + 20 - 240, other, 1),  # producer 240 s behind
        QueueRecord(0, 2, T0 + 20 + 240, other, 2),  # a tracker's copy: not the producer's
    ]
    run = RunLog(1, LEASE_S, 1.0, T0, T0 + 3600, [], [])
    report = check(run, Ledgers(sent={MID: T0 + 10, other: T0 + 20}), MarkerLog(), queue)
    assert report.skewed_records == (1, 1)


@pytest.mark.parametrize(
    ("killed", "faults", "cause"),
    [
        (T0 + 8.0, (), "unread_reader_killed"),
        (None, (Fault("stall", T0 + 7.0, T0 + 9.0, 10, True),), "unread_fault"),
        (T0 - 30.0, (), "unread_silent"),  # killed long before: no cause of this one
        (None, (), "unread_silent"),
    ],
)
def test_a_copy_nobody_took_copied_again_is_explained_by_a_kill_or_fault(
    killed: float | None, faults: tuple[Fault, ...], cause: str
) -> None:
    report = run_check(
        [worker("w0.1", 0.0, killed=killed), worker("w1.1", 0.0)],
        [event("took", "w1.1", T0 + 11, attempt=2)],
        [marker(MarkerType.REDELIVERED, T0 + 10, attempt=2, reason=UNREAD_REASON)],
        faults,
    )
    assert report.causes == {cause: 1}
    assert report.unexplained == [] and report.early == []
    assert len(report.overload) == (cause == "unread_silent")
    assert report.delays_beyond_lease_s == [], "no holder's lease to time it from"


def slow_redelivery(
    redelivered: float,
    taken: float,
    others: list[WorkerEvent],
    trackers: list[Incarnation],
    reads: tuple[Reads, ...] = (),
) -> Report:
    """The holder w0.1 killed at T0 + 2 (its lease ends at T0 + 4); w1.1 takes the copy;
    w2.1 lives on."""
    return run_check(
        [worker("w0.1", 0.0, killed=T0 + 2), worker("w1.1", 0.0), worker("w2.1", 0.0), *trackers],
        [event("took", "w0.1", T0 + 1), event("took", "w1.1", taken, attempt=2), *others],
        [
            marker(MarkerType.START, T0 + 1),
            marker(MarkerType.REDELIVERED, redelivered, attempt=2, reason="lease expired"),
        ],
        reads=reads,
    )


def test_a_copy_taken_late_with_no_reader_of_its_queue_left_is_counted_so() -> None:
    report = slow_redelivery(T0 + 4.5, T0 + 20, [], [])
    assert report.delays_beyond_lease_s == [pytest.approx(20 - 2 - LEASE_S)]
    assert report.slow_kinds == {"no_reader": 1}
    assert "over_10s=1 (no_reader=1)" in report.summary("")
    assert "(no_reader)" in report.slow_redeliveries[0][1]


def test_a_copy_taken_late_although_its_queue_had_a_live_reader_is_counted_so() -> None:
    # w2.1 took another message of the queue just before the copy was written.
    other = WorkerEvent("took", "w2.1", T0 + 4, "n" * 32, "q0", 1, (0, 0, 3))
    assert slow_redelivery(T0 + 4.5, T0 + 20, [other], []).slow_kinds == {"reader_slow": 1}
    # Another queue's reader does not count.
    elsewhere = WorkerEvent("took", "w2.1", T0 + 4, "n" * 32, "q1", 1, (0, 0, 3))
    assert slow_redelivery(T0 + 4.5, T0 + 20, [elsewhere], []).slow_kinds == {"no_reader": 1}


def test_a_copy_written_late_is_counted_by_whether_a_tracker_was_killed() -> None:
    tracker = Incarnation("t0.1", "tracker", 0, 0.0, started=T0, killed=T0 + 3)
    assert slow_redelivery(T0 + 16, T0 + 16.5, [], [tracker]).slow_kinds == {"tracker_killed": 1}
    assert slow_redelivery(T0 + 16, T0 + 16.5, [], []).slow_kinds == {"tracker_slow": 1}
    # A tracker killed before the holder was is not why the copy came late.
    before = Incarnation("t0.1", "tracker", 0, 0.0, started=T0, killed=T0 + 1)
    assert slow_redelivery(T0 + 16, T0 + 16.5, [], [before]).slow_kinds == {"tracker_slow": 1}


def test_delays_within_the_bound_are_not_counted_slow() -> None:
    report = slow_redelivery(T0 + 4.5, T0 + 13, [], [])
    assert report.delays_beyond_lease_s == [pytest.approx(13 - 2 - LEASE_S)]
    assert report.slow_kinds == {}
    assert "over_10s=0 ()" in report.summary("")


def test_a_worker_that_said_it_reads_the_queues_retry_lane_counts_as_a_reader() -> None:
    # An idle member's spare: it took nothing of the queue, but its last reads line names one.
    spare = Reads("w2.1", T0 + 1, "q0", (3,))
    assert slow_redelivery(T0 + 4.5, T0 + 20, [], [], (spare,)).slow_kinds == {"reader_slow": 1}
    for reads in (
        (spare, Reads("w2.1", T0 + 3, "q0", ())),  # then it stopped reading
        (Reads("w2.1", T0 + 1, "q1", (3,)),),  # another queue's
        (Reads("w2.1", T0 + 6, "q0", (3,)),),  # only after the copy was written
        (Reads("w0.1", T0 + 1, "q0", (3,)),),  # the killed holder
    ):
        assert slow_redelivery(T0 + 4.5, T0 + 20, [], [], reads).slow_kinds == {"no_reader": 1}


def test_read_ledgers_keeps_reads_lines_apart(tmp_path: Path) -> None:
    lines = [
        {"e": "reads", "t": T0 + 1, "q": "q0", "queue": [], "retry": [3]},
        {"e": "took", "t": T0 + 2, "id": MID, "q": "q0", "a": 1, "l": 0, "p": 1, "o": 7},
    ]
    (tmp_path / "w0.1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ledgers = read_ledgers(tmp_path, [worker("w0.1", 0.0)])
    assert ledgers.reads == [Reads("w0.1", T0 + 1, "q0", (3,))]
    assert [(e.kind, e.worker, e.delivery) for e in ledgers.events] == [("took", "w0.1", RECORD)]
