"""Redelivering: what copy a due delivery becomes (pure), and writing copies and their
markers (plainly or in one transaction), reporting each one's outcome."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from kmq.markers import MAX_ATTEMPT, QUEUE_LANE, MarkerType, encode_entries
from kmq.policy import DEAD_LETTER_SUFFIX
from kmq.records import dead_letter_headers, parse_queue_headers, queue_headers, split_key
from tracker.reread import Record
from tracker.state import Due

log = logging.getLogger("kmq.tracker")

_REDELIVERED = int(MarkerType.REDELIVERED)
_DEAD_LETTERED = int(MarkerType.DEAD_LETTERED)


@dataclass(frozen=True, slots=True)
class Copy:
    """A redelivery about to be written: the message again, with its next attempt, or its
    dead letter."""

    due: Due
    queue: str
    message_id: str
    attempt: int
    """The attempt the copy carries (for a dead letter: the attempts it had)."""
    payload: bytes
    headers: tuple[tuple[str, bytes], ...]
    """The user's headers."""
    dead_letter_queue: str | None
    """Set when the message is out of attempts: it goes to this queue instead."""

    @property
    def destination(self) -> str:
        return self.dead_letter_queue or self.queue


def copy_of(due: Due, record: Record) -> Copy:
    """The copy ``due`` becomes, from its re-read record."""
    message_id, attempt, user = parse_queue_headers(record.headers)
    _, partition, offset = split_key(due.key)
    queue = (record.key or b"").decode("utf-8", "replace")
    next_attempt = attempt + due.attempt_step
    out_of_attempts = 0 < due.max_attempts < next_attempt
    return Copy(
        due=due,
        queue=queue,
        message_id=message_id or f"ext-{partition}-{offset}",
        attempt=attempt if out_of_attempts else min(next_attempt, MAX_ATTEMPT),
        payload=record.value or b"",
        headers=user,
        dead_letter_queue=(due.dead_letter_queue or queue + DEAD_LETTER_SUFFIX)
        if out_of_attempts
        else None,
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    copy: Copy
    written: bool
    """The copy is on the broker: the delivery is done, whether its marker made it or not
    (without the marker, a restarted tracker may redeliver it once more)."""


class Redeliverer:
    """Writes copies to the queue topic and their REDELIVERED / DEAD_LETTERED markers.

    ``partitions(queue)`` gives the partitions a queue's records go to (its layout); a copy
    stays on its original partition when that is one of them.
    """

    def __init__(
        self,
        producer: KafkaProducer,
        queue_topic: str,
        marker_topic: str,
        partitions: Callable[[str], tuple[int, ...]],
        timeout_s: float,
    ) -> None:
        self._producer = producer
        self._queue_topic = queue_topic
        self._marker_topic = marker_topic
        self._partitions = partitions
        self._timeout_s = timeout_s

    def _target(self, copy: Copy) -> int:
        choices = self._partitions(copy.destination)
        lane, partition, offset = split_key(copy.due.key)
        if lane == QUEUE_LANE and partition in choices:
            return partition
        return choices[offset % len(choices)]

    def send_copy(self, producer: KafkaProducer, copy: Copy) -> Any:
        if copy.dead_letter_queue is None:
            headers = queue_headers(copy.message_id, copy.attempt, copy.headers)
        else:
            headers = dead_letter_headers(
                copy.message_id, copy.queue, copy.attempt, copy.due.reason, copy.headers
            )
        return producer.send(
            self._queue_topic,
            key=copy.destination.encode(),
            value=copy.payload,
            headers=headers,
            partition=self._target(copy),
        )

    def send_marker(self, producer: KafkaProducer, copy: Copy) -> Any:
        kind = _REDELIVERED if copy.dead_letter_queue is None else _DEAD_LETTERED
        lane, partition, offset = split_key(copy.due.key)
        text = copy.due.reason.encode()
        entry = (kind, lane, partition, offset, copy.attempt, 0, 0, len(text))
        # The partition its START came from, where every marker of the message belongs.
        return producer.send(
            self._marker_topic,
            key=copy.message_id.encode(),
            value=encode_entries([entry], [text] if text else []),
            partition=copy.due.marker_partition,
        )

    def plainly(self, copies: list[Copy]) -> list[Outcome]:
        """Copies first; a copy's marker only once the broker holds the copy."""
        futures = []
        outcomes: list[Outcome] = []
        for copy in copies:
            try:
                futures.append((copy, self.send_copy(self._producer, copy)))
            except KafkaError as exc:
                log.warning("redelivery of %s failed (%r); retrying", copy.message_id, exc)
                outcomes.append(Outcome(copy, False))
        markers = []
        for copy, future in futures:
            try:
                future.get(timeout=self._timeout_s)
            except KafkaError as exc:
                log.warning("redelivery of %s failed (%r); retrying", copy.message_id, exc)
                outcomes.append(Outcome(copy, False))
                continue
            try:
                markers.append((copy, self.send_marker(self._producer, copy)))
            except KafkaError as exc:
                log.error("marker for %s not written (%r)", copy.message_id, exc)
                outcomes.append(Outcome(copy, True))
        for copy, future in markers:
            try:
                future.get(timeout=self._timeout_s)
            except KafkaError as exc:
                log.error("marker for %s not written (%r)", copy.message_id, exc)
            outcomes.append(Outcome(copy, True))
        return outcomes

    def in_transaction(
        self,
        txn: KafkaProducer,
        copies: list[Copy],
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group_metadata: Any,
    ) -> list[Outcome]:
        """Copies, their markers and the markers-offset commit that skips them: all or none."""
        try:
            txn.begin_transaction()
            for copy in copies:
                self.send_copy(txn, copy)
                self.send_marker(txn, copy)
            if offsets:
                txn.send_offsets_to_transaction(dict(offsets), group_metadata)
            txn.commit_transaction()
        except KafkaError as exc:
            log.warning("redelivery transaction failed (%r); retrying", exc)
            with contextlib.suppress(KafkaError):
                txn.abort_transaction()
            return [Outcome(copy, False) for copy in copies]
        return [Outcome(copy, True) for copy in copies]
