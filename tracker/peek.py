"""*Owns* entries read past a markers partition's last stable offset, so that a replica whose
reading is held there can still tell a dead peer from a live one (:mod:`tracker.orphans`).

The markers reader reads ``read_committed``: nothing past the first record of a
transaction still open reaches it. On Apache Kafka only a transaction on that partition
holds it, and the broker aborts one its producer abandoned within the transaction timeout.
The embedded broker (Tansu 0.6) also holds every partition of a transaction that shares
a partition with one still open, and never aborts an abandoned one: a replica killed inside
a redelivery round leaves its transaction open on its markers partition and on retry
partitions that every replica's rounds write to, so the next round of each survivor is held
too, and every survivor reads nothing more on its own partitions until a claim of the dead
one's partitions ends its transaction. Silence is judged by this replica's own beacons read
back, so a survivor held that way never adopted, and waited for the group: its session,
then a rebalance (in full chaos run 59, 12 of 37 tracker kills held a survivor's reading
for 3 to 10 s; the run's slowest copies waited on one).

Beacons and *owns* entries are written outside transactions (by the plain producer), so a
``read_uncommitted`` reader sees them as they land. It reads only partitions held
(:func:`to_peek`), from where the markers reader stands, and passes on only *owns* entries:
never a START, END or anything a transaction wrote, which may yet be aborted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kafka import TopicPartition

from kmq.errors import MarkerDecodeError
from kmq.markers import MarkerType, parse
from tracker.orphans import parse_owns

HELD_S = 1.0
"""A partition whose reading has stood still below its high watermark this long is read
past its hold: longer than a live replica's redelivery round takes when nothing is wrong
(a few hundred ms), shorter than the silence after which a peer is adopted from."""

_PROBE = int(MarkerType.PROBE)

Owns = tuple[int, frozenset[int], float]
"""An *owns* entry: the writer's clock, the partitions it names, its send time in seconds."""


class PeekConsumer(Protocol):
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def seek(self, partition: TopicPartition, offset: int) -> None: ...
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> Mapping[Any, Any]: ...
    def close(self) -> None: ...


def to_peek(behind_s: Mapping[int, float], held_s: float = HELD_S) -> frozenset[int]:
    """The partitions to read past their hold: those whose position has stood still below
    the high watermark for ``held_s`` or more (``behind_s``: partition -> seconds)."""
    return frozenset(p for p, s in behind_s.items() if s >= held_s)


def owns_entries(value: bytes | None) -> list[Owns]:
    """The *owns* entries of one markers record (none from a record that is not a marker)."""
    try:
        entries, texts = parse(value)
    except MarkerDecodeError:
        return []
    out: list[Owns] = []
    for entry, text in zip(entries, texts, strict=True):
        # A beacon's entry: a PROBE with no tracker's nonce, its send time at [3].
        if entry[0] == _PROBE and entry[4] == 0 and text:
            owns = parse_owns(text)
            if owns is not None:
                out.append((owns[0], owns[1], entry[3] / 1000))
    return out


class OwnsPeek:
    """Reads the *owns* entries past the hold of the partitions it is told to follow."""

    def __init__(self, consumer: PeekConsumer, topic: str) -> None:
        self._consumer = consumer
        self._topic = topic
        self._following: frozenset[int] = frozenset()

    @property
    def following(self) -> frozenset[int]:
        return self._following

    def follow(self, partitions: frozenset[int], positions: Mapping[int, int]) -> None:
        """Read ``partitions``, each new one from its ``positions`` offset (where the markers
        reader stands); stop reading the others."""
        if partitions == self._following:
            return
        new = partitions - self._following
        topic = self._topic
        self._consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        self._following = partitions
        for p in sorted(new):
            if p in positions:
                self._consumer.seek(TopicPartition(topic, p), positions[p])

    def close(self) -> None:
        self._consumer.close()

    def read(self) -> list[Owns]:
        """The *owns* entries fetched since the last call (never waits)."""
        if not self._following:
            return []
        out: list[Owns] = []
        for batch in self._consumer.poll(timeout_ms=0, max_records=5000).values():
            for record in batch:
                out.extend(owns_entries(record.value))
        return out
