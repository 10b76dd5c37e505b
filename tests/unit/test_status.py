"""``kmq status``'s pure part: pairing markers into open deliveries, counting, rendering; and
the command's errors that need no broker."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.cli import main
from kmq.dev.embedded import free_port
from kmq.markers import LANES, QUEUE_LANE, RETRY_LANE, Marker, MarkerType, encode, encode_batch
from kmq.markers_v1 import encode_v1
from kmq.status import (
    OpenDeliveries,
    QueueStatus,
    Status,
    TrackerGroup,
    TrackerMember,
    assigned_partitions,
    count_in_range,
    in_flight_of,
    render,
    to_json,
)
from kmq.status_read import _clusters
from tracker.state import PartitionState

T = MarkerType


def _m(kind: MarkerType, partition: int, offset: int, lane: int = QUEUE_LANE) -> Marker:
    return Marker(type=kind, partition=partition, offset=offset, lane=lane)


def _open(opened: OpenDeliveries) -> set[tuple[int, int, int]]:
    return {(d.lane, d.partition, d.offset) for d in opened.open()}


@pytest.mark.parametrize(
    ("settle", "still_open"),
    [
        (T.END, False),
        (T.REDELIVERED, False),
        (T.DEAD_LETTERED, False),
        (T.NACK, True),  # open until the tracker's copy is out
        (T.RELEASE, True),
        (T.REJECT, True),
        (T.KEEPALIVE, True),
    ],
)
def test_a_start_stays_open_until_it_is_settled(settle: MarkerType, still_open: bool) -> None:
    opened = OpenDeliveries()
    opened.apply(0, 1000, encode(_m(T.START, 1, 7)))
    opened.apply(0, 1100, encode(_m(settle, 1, 7)))
    assert _open(opened) == ({(QUEUE_LANE, 1, 7)} if still_open else set())


def test_pairing_tells_lanes_apart_and_ignores_markers_of_starts_before_the_commit() -> None:
    opened = OpenDeliveries()
    opened.apply(0, 1000, encode(_m(T.END, 0, 1)))  # its START lies before the commit point
    opened.apply(0, 1000, encode_batch([_m(T.START, 0, 5), _m(T.START, 0, 5, RETRY_LANE)]))
    opened.apply(1, 1200, encode(_m(T.START, 0, 5)))  # a second START keeps the first's time
    opened.apply(0, 1300, encode(_m(T.END, 0, 5, RETRY_LANE)))
    assert _open(opened) == {(QUEUE_LANE, 0, 5)}
    (delivery,) = opened.open()
    assert (delivery.start_ms, delivery.marker_partition, delivery.queue) == (1000, 0, "")


def test_version_1_markers_name_their_queue_and_junk_is_counted() -> None:
    opened = OpenDeliveries()
    opened.apply(2, 500, encode_v1(type=T.START, queue="old", message_id="m1", partition=3,
                                   offset=9, attempt=1))  # fmt: skip
    opened.apply(2, 600, b"\x02junk")
    assert [(d.queue, d.partition, d.offset) for d in opened.open()] == [("old", 3, 9)]
    assert opened.bad_records == 1


def test_in_flight_of_a_queue_counts_its_deliveries_and_ages_the_oldest() -> None:
    opened = OpenDeliveries()
    opened.apply(0, 10_000, encode(_m(T.START, 0, 1)))
    opened.apply(0, 12_000, encode(_m(T.START, 0, 2)))
    opened.apply(0, 11_000, encode(_m(T.START, 1, 1)))
    opened.apply(0, 9_000, encode_v1(type=T.START, queue="jobs", message_id="x", partition=5,
                                     offset=5, attempt=1))  # fmt: skip
    queue_of = {(QUEUE_LANE, 0, 1): "jobs", (QUEUE_LANE, 0, 2): "jobs", (QUEUE_LANE, 1, 1): "b"}
    assert in_flight_of(opened.open(), queue_of, "jobs", 20_000) == (3, 11.0)
    assert in_flight_of(opened.open(), queue_of, "b", 20_000) == (1, 9.0)
    assert in_flight_of(opened.open(), queue_of, "none", 20_000) == (0, None)


@pytest.mark.parametrize(
    ("matched", "start", "end", "read_to", "expected"),
    [
        (3, 10, 20, 20, (3, True)),  # read to the end: exact
        (3, 10, 20, 25, (3, True)),
        (3, 10, 20, 15, (8, False)),  # 5 offsets unread count whole
        (0, 10, 20, 0, (10, False)),  # nothing read
        (0, 20, 10, 0, (0, True)),  # committed past the end (a legacy stop)
    ],
)
def test_count_in_range(
    matched: int, start: int, end: int, read_to: int, expected: tuple[int, bool]
) -> None:
    assert count_in_range(matched, start, end, read_to) == expected


def test_assigned_partitions_from_kafka_pythons_description() -> None:
    described = {
        "assigned_partitions": [
            {"topic": "m", "partitions": [3, 1]},
            {"topic": "other", "partitions": [0]},
        ],
        "user_data": "",
    }
    assert assigned_partitions(described, "m") == (1, 3)
    assert assigned_partitions(described, "x") == ()
    assert assigned_partitions("", "m") is None  # the embedded Tansu sends no assignment


def test_offsets_of_open_deliveries_are_read_in_clusters() -> None:
    assert _clusters([5]) == [(5, 6)]
    assert _clusters([1, 2, 4000, 20_000, 20_001]) == [(1, 4001), (20_000, 20_002)]


def _status(*queues: QueueStatus, members: tuple[TrackerMember, ...] = ()) -> Status:
    return Status(
        taken_at_ms=1_700_000_000_000,
        queue_topic="kmq.queue",
        queues=queues,
        tracker=TrackerGroup("kmq-tracker", "Stable", members, {0: 4}),
        unattributed_in_flight=2,
        notes=("a note",),
    )


def _queue(name: str, **changes: object) -> QueueStatus:
    fields: dict[str, object] = {
        "queue": name,
        "partitions": (1, 2),
        "backlog_records": 12,
        "in_flight": 3,
        "oldest_in_flight_age_s": 130.0,
        "redeliveries": 1,
        "dead_letters": 0,
        "dead_letter_queue": f"{name}.dlq",
        "paused_until_ms": 0,
    }
    fields.update(changes)
    return QueueStatus(**fields)  # type: ignore[arg-type]


def test_the_table_has_a_row_per_queue_and_a_line_per_tracker() -> None:
    text = render(
        _status(
            _queue("emails"),
            _queue(
                "invoices",
                exact=False,
                in_flight=0,
                oldest_in_flight_age_s=None,
                paused_until_ms=1_700_000_600_000,
            ),
            members=(
                TrackerMember("m-1", "kmq-tracker", "/10.0.0.1", (0, 1)),
                TrackerMember("m-2", "", "", None),
            ),
        )
    )
    lines = text.splitlines()
    assert lines[2].split() == ["QUEUE", "BACKLOG", "IN", "FLIGHT", "OLDEST", "REDELIVERED",
                                "DEAD", "LETTERS", "PAUSED", "UNTIL"]  # fmt: skip
    assert lines[3].split() == ["emails", "12", "3", "2.2m", "1", "0", "-"]
    assert lines[4].split() == ["invoices", "<=12", "0", "-", "<=1", "<=0",
                                "2023-11-14T22:23:20+00:00"]  # fmt: skip
    assert "2 open deliveries of unknown queue" in text
    assert "tracker group kmq-tracker (Stable): 2 replicas" in text
    assert "  m-1  kmq-tracker  /10.0.0.1  partitions 0, 1" in lines
    assert "  m-2  -  -  partitions ?" in lines
    assert lines[-1] == "note: a note"


def test_no_queues_and_json() -> None:
    assert "no queues found" in render(_status())
    doc = json.loads(to_json(_status(_queue("a"))))
    assert doc["queues"][0]["backlog_records"] == 12
    assert doc["queues"][0]["oldest_in_flight_age_s"] == 130.0
    assert doc["tracker"]["committed_offsets"] == {"0": 4}


def test_an_unreachable_broker_is_one_clear_error() -> None:
    argv = ["status", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--timeout-s", "1"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot connect to Kafka at 127.0.0.1:")
    assert result.output.count("\n") == 1


def test_a_bad_queue_id_is_refused_before_connecting() -> None:
    argv = ["status", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "bad queue"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1
    assert "whitespace" in result.output


_KINDS = [T.START, T.START, T.KEEPALIVE, T.END, T.NACK, T.RELEASE, T.REJECT, T.REDELIVERED,
          T.DEAD_LETTERED]  # fmt: skip
_record = st.lists(
    st.tuples(
        st.sampled_from(_KINDS), st.sampled_from(LANES), st.integers(0, 2), st.integers(0, 4)
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, max_size=40))
def test_replaying_from_the_trackers_commit_finds_exactly_its_open_deliveries(
    records: list[list[tuple[MarkerType, int, int, int]]],
) -> None:
    """What ``kmq status`` relies on: the tracker commits no further than its earliest open
    START, so pairing the markers from its committed offset gives its in-flight set."""
    values = [
        encode_batch(
            [
                Marker(type=k, lane=lane, partition=p, offset=o, redeliver_after_ms=60_000)
                for k, lane, p, o in batch
            ]
        )
        for batch in records
    ]
    state = PartitionState(0)
    state.set_position(0)
    for offset, value in enumerate(values):
        state.on_record(offset, value, now=0.0)
        committed = state.commit_offset()
        assert committed is not None
        opened = OpenDeliveries()
        for replayed in values[committed : offset + 1]:
            opened.apply(0, 0, replayed)
        assert _open(opened) == set(state.deliveries())
