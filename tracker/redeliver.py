"""Redelivering: what copy a due delivery becomes (pure), and writing a markers partition's
copies and, in one fenced transaction, their markers, reporting how it ended."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from kmq import txn_wait
from kmq.layout import away_from_holder, toward_live_reader
from kmq.markers import (
    MAX_ATTEMPT,
    MAX_TEXT_BYTES,
    QUEUE_LANE,
    RETRY_LANE,
    MarkerType,
    encode_entries,
)
from kmq.policy import DEAD_LETTER_SUFFIX
from kmq.records import dead_letter_headers, parse_queue_headers, queue_headers, split_key
from kmq.txn_wait import TransactionStuck
from tracker.fencing import is_fenced
from tracker.reread import Record
from tracker.state import Due

log = logging.getLogger("kmq.tracker")

TXN_TIMEOUT_S = 10.0
"""The longest a round waits for its transaction's offset commit, commit or abort."""

FENCE_CHECK_TIMEOUT_S = 5.0
"""The longest a round waits for its fence check. One tiny produce, answered in milliseconds
unless the network is down: past the chaos suite's longest stall of every connection (3 s)
and a reconnect. Not answered by then, the round gives its producer up and claims the
partition again, with nothing sent yet, instead of waiting out the round's 10 s and then an
abort: in chaos run 70, two rounds begun just before a reset of every connection waited the
whole 10 s on it, and the replica's loop with them."""

_REDELIVERED = int(MarkerType.REDELIVERED)
_DEAD_LETTERED = int(MarkerType.DEAD_LETTERED)
_WATCH = int(MarkerType.WATCH)
_NO_OP = (int(MarkerType.PROBE), 0, 0, 0, 0, 0, 0, 0)


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
class RoundOutcome:
    """How one markers partition's redelivery transaction ended."""

    written: bool
    """All of its copies, their markers and the offset commit are on the broker."""
    fenced: bool = False
    """The broker refused it: another replica has claimed the partition since."""
    stuck: bool = False
    """The transaction coordinator did not answer in time: drop the producer and claim
    the partition again before its next round."""
    placed: tuple[tuple[int, int] | None, ...] = field(default=(), compare=False)
    """Once written: where each copy landed on the retry topic, (partition, offset), in the
    order of the copies (``None`` for a dead letter, or where the client did not say)."""
    written_again: int = field(default=0, compare=False)
    """Copies written a second time because the broker did not say where the first landed
    (:meth:`Redeliverer._place_again`)."""


class Redeliverer:
    """Writes a markers partition's due copies (to the retry topic, ahead of any backlog on
    the queue topic) and dead letters (to the queue topic, as the dead-letter queue's own
    records), and their REDELIVERED / DEAD_LETTERED markers and the markers-offset commit
    that skips them in one transaction of that partition's producer.

    The copies themselves go through another producer, outside the transaction: after a
    marker that changes nothing has gone through the transaction (so a fenced replica sends
    no copy), and before any REDELIVERED / DEAD_LETTERED marker is written (so no marker,
    committed or not, is ever on the broker without its copy: the embedded broker shows an
    aborted transaction's records to read_committed readers). A round that fails after its
    copies went out leaves them readable, and its deliveries are redelivered again:
    duplicates, never a loss. Written inside, they would make every replica's transactions
    share the retry partitions, and the embedded broker can leave two such transactions
    ended at once unfinished for good, holding every markers partition (chaos runs 67 and
    68, ``bench.broker_txn_race --overlap``); this way a transaction writes to its own
    markers partition only.

    ``partitions(topic, queue)`` gives the partitions a queue's records go to on a topic
    (its layout); ``live(queue)`` the retry-topic partitions its consumers said they read
    lately (:class:`tracker.readers.LiveReaders`), ``lately(queue)`` those of them said
    within a shorter time, which go first, and ``busy(queue)`` those said within a shorter
    time still, which go before those.

    With ``watch_copies``, a round also writes a WATCH marker for each copy it sends to a
    spare (a retry partition outside its queue's window, :func:`kmq.layout.spare_candidates`),
    naming where the copy landed (known once the broker has acknowledged it, before the
    commit), so a tracker that replays the partition later watches the copy too
    (:meth:`tracker.state.PartitionState.redelivered`). Only a member given that spare reads
    it, so a copy there whose watch was lost with its tracker could be read by nobody; a
    copy in the window is read by its queue partition's next owner in any case.
    """

    def __init__(
        self,
        queue_topic: str,
        retry_topic: str | None,
        marker_topic: str,
        partitions: Callable[[str, str], tuple[int, ...]],
        txn_timeout_s: float = TXN_TIMEOUT_S,
        fence_check_timeout_s: float = FENCE_CHECK_TIMEOUT_S,
        live: Callable[[str], Collection[int]] = lambda queue: (),
        lately: Callable[[str], Collection[int]] = lambda queue: (),
        busy: Callable[[str], Collection[int]] = lambda queue: (),
        watch_copies: bool = False,
    ) -> None:
        self._queue_topic = queue_topic
        self._watch_copies = watch_copies and retry_topic is not None
        self._live = live
        self._lately = lately
        self._busy = busy
        self._txn_timeout_s = txn_timeout_s
        self._fence_check_timeout_s = fence_check_timeout_s
        self._retry_topic = retry_topic
        self._marker_topic = marker_topic
        self._partitions = partitions

    def target(self, copy: Copy) -> tuple[str, int]:
        """Topic and partition a copy (or dead letter) goes to.

        A copy goes to a retry-lane partition that another consumer than its holder reads:
        one a consumer has lately said it reads (:func:`kmq.layout.toward_live_reader`),
        those said most lately first, else the one that goes with another queue partition
        than the holder's (:func:`kmq.layout.away_from_holder`). A killed holder's own
        partitions, or those of a consumer killed with it, wait for their group to notice;
        a live one is read at once."""
        lane, partition, offset = split_key(copy.due.key)
        if copy.dead_letter_queue is None and self._retry_topic is not None:
            topic, lane_here = self._retry_topic, RETRY_LANE
            choices = self._partitions(topic, copy.destination)
            queue_window = self._partitions(self._queue_topic, copy.destination)
            lane_is_retry = lane == RETRY_LANE
            away = None
            for live in (self._busy, self._lately, self._live):
                away = toward_live_reader(
                    queue_window, choices, partition, lane_is_retry, live(copy.destination), offset
                )
                if away is not None:
                    break
            if away is None:
                away = away_from_holder(queue_window, choices, partition, lane_is_retry)
            if away is not None:
                return topic, away
        else:
            topic, lane_here = self._queue_topic, QUEUE_LANE
            choices = self._partitions(topic, copy.destination)
        if lane == lane_here and partition in choices:
            return topic, partition
        return topic, choices[offset % len(choices)]

    def send_copy(self, producer: Any, copy: Copy, where: tuple[str, int]) -> Any:
        """Send ``copy`` to ``where`` (topic, partition: :meth:`target`'s choice)."""
        if copy.dead_letter_queue is None:
            headers = queue_headers(copy.message_id, copy.attempt, copy.headers)
        else:
            headers = dead_letter_headers(
                copy.message_id, copy.queue, copy.attempt, copy.due.reason, copy.headers
            )
        topic, partition = where
        return producer.send(
            topic,
            key=copy.destination.encode(),
            value=copy.payload,
            headers=headers,
            partition=partition,
        )

    def send_marker(self, producer: Any, copy: Copy) -> Any:
        kind = _REDELIVERED if copy.dead_letter_queue is None else _DEAD_LETTERED
        lane, partition, offset = split_key(copy.due.key)
        text = copy.due.reason.encode()
        if len(text) > MAX_TEXT_BYTES:  # a version 1 reason, or bad UTF-8 read as U+FFFDs
            text = text[:MAX_TEXT_BYTES].decode("utf-8", "ignore").encode()
        entry = (kind, lane, partition, offset, copy.attempt, 0, 0, len(text))
        # The partition its START came from, where every marker of the message belongs.
        return producer.send(
            self._marker_topic,
            key=copy.message_id.encode(),
            value=encode_entries([entry], [text] if text else []),
            partition=copy.due.marker_partition,
        )

    def send_watch(self, producer: Any, copy: Copy, placed: tuple[int, int]) -> Any:
        """The WATCH marker of a copy that landed at ``placed`` on the retry topic."""
        text = copy.destination.encode()[:MAX_TEXT_BYTES]
        entry = (_WATCH, RETRY_LANE, *placed, copy.attempt, 0, copy.due.max_attempts, len(text))
        return producer.send(
            self._marker_topic,
            key=copy.message_id.encode(),
            value=encode_entries([entry], [text] if text else []),
            partition=copy.due.marker_partition,
        )

    def _on_spare(self, copy: Copy, where: tuple[str, int]) -> bool:
        """Whether a copy sent to ``where`` is to be watched by a WATCH marker."""
        topic, partition = where
        return (
            self._watch_copies
            and copy.dead_letter_queue is None
            and topic == self._retry_topic
            and partition not in self._partitions(topic, copy.destination)
        )

    def _send_watches(self, txn: Any, sent: list[tuple[Copy, Any]]) -> None:
        """The WATCH markers of the copies ``sent`` to spares, once they are on the broker."""
        for copy, future in sent:
            placed = _placed(future)
            if placed is not None:
                self.send_watch(txn, copy, placed)

    def _flushed(
        self,
        producer: Any,
        futures: list[Any],
        timeout_s: float,
        what: str,
        unanswered: type[KafkaTimeoutError] = KafkaTimeoutError,
    ) -> None:
        """Wait up to ``timeout_s`` until ``futures`` (sent by ``producer``) are answered;
        raise the first failure. One not answered raises ``unanswered``: a marker must never
        be committed without its copy, and a fence check not answered gives the producer up
        (:class:`TransactionStuck`)."""
        if not futures:
            return
        try:
            producer.flush(timeout=timeout_s)
        except KafkaTimeoutError as exc:
            raise unanswered(f"{what} not answered in {timeout_s:g} s") from exc
        for future in futures:
            if not getattr(future, "is_done", False):
                raise unanswered(f"{what} not answered after the flush")
            if future.failed():
                raise future.exception

    def _place_again(
        self, out: Any, copies: list[Copy], targets: list[tuple[str, int]], futures: list[Any]
    ) -> int:
        """Write once more each copy the broker took without saying at what offset, so that
        the one kept in ``futures`` can be watched until it is read. Returns how many.

        A write retried after a network fault that finds its records already written is
        answered with offset -1 (the embedded broker's DUPLICATE_SEQUENCE_NUMBER; Kafka
        names the first write's offset). Such a copy could not be watched (the watch knows
        a copy by where it landed), so if its reader died before taking it, it waited for
        the queue's group to notice: taken 17 s after they were written (19 to 21 s
        beyond the lease) for three copies in full chaos run 82, of 28 written that way.
        The first write is delivered too, once its partition is read: a duplicate, as with
        any copy copied again. One not placed the second time either stays unwatched."""
        unplaced = [
            i
            for i, copy in enumerate(copies)
            if copy.dead_letter_queue is None and _placed(futures[i]) is None
        ]
        if not unplaced:
            return 0
        again = [self.send_copy(out, copies[i], targets[i]) for i in unplaced]
        self._flushed(out, again, self._txn_timeout_s, "a redelivery written again")
        placed_now = 0
        for i, future in zip(unplaced, again, strict=True):
            futures[i] = future
            placed_now += _placed(future) is not None
        log.info(
            "%d copies written without an offset from the broker (a retried write): "
            "written again, %d of them placed this time",
            len(unplaced), placed_now,
        )  # fmt: skip
        return len(unplaced)

    def send_fence_check(self, txn: Any, partition: int) -> Any:
        """A marker that changes nothing (a PROBE of no tracker's, like a consumer's "still
        here") to ``partition``, in the transaction: its produce is refused once another
        replica has claimed the partition."""
        return txn.send(self._marker_topic, value=encode_entries([_NO_OP], []), partition=partition)

    def round(
        self,
        txn: Any,
        copies: list[Copy],
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group_metadata: Any,
        out: Any,
    ) -> RoundOutcome:
        """The copies through ``out``, then their markers and the markers-offset commit that
        skips them, all or none, in ``txn`` (see the class)."""
        futures: list[Any] = []
        try:
            txn.begin_transaction()
            if copies:
                # A fenced producer fails here, before any copy is out.
                check = self.send_fence_check(txn, copies[0].due.marker_partition)
                self._flushed(
                    txn, [check], self._fence_check_timeout_s, "fence check", TransactionStuck
                )
            targets = [self.target(copy) for copy in copies]
            for copy, where in zip(copies, targets, strict=True):
                futures.append(self.send_copy(out, copy, where))
            # Every copy is on the broker before any marker saying so is written: a round
            # that ends badly leaves duplicates, never a marker without its copy (the
            # embedded broker shows an aborted transaction's markers to every reader).
            self._flushed(out, futures, self._txn_timeout_s, "a redelivery write")
            written_again = self._place_again(out, copies, targets, futures)
            for copy in copies:
                self.send_marker(txn, copy)
            self._send_watches(
                txn,
                [
                    (copy, future)
                    for copy, where, future in zip(copies, targets, futures, strict=True)
                    if self._on_spare(copy, where)
                ],
            )
            if offsets:
                txn_wait.send_offsets(txn, offsets, group_metadata, self._txn_timeout_s)
            txn_wait.commit(txn, self._txn_timeout_s)
        except TransactionStuck as exc:
            log.warning("redelivery transaction stuck (%s); claiming the partition again", exc)
            return RoundOutcome(False, stuck=True)
        except KafkaError as exc:
            if is_fenced(exc):
                return RoundOutcome(False, fenced=True)
            log.warning("redelivery transaction failed (%r); retrying", exc)
            try:
                txn_wait.abort(txn, self._txn_timeout_s)
            except TransactionStuck:
                return RoundOutcome(False, stuck=True)
            except KafkaError:
                pass
            return RoundOutcome(False)
        return RoundOutcome(
            True,
            written_again=written_again,
            placed=tuple(
                _placed(future) if copy.dead_letter_queue is None else None
                for copy, future in zip(copies, futures, strict=True)
            ),
        )


def _placed(future: Any) -> tuple[int, int] | None:
    """(partition, offset) of a written record, from its send future."""
    if not getattr(future, "is_done", False) or not future.succeeded():
        return None
    metadata = future.value
    partition, offset = getattr(metadata, "partition", None), getattr(metadata, "offset", None)
    if not isinstance(partition, int) or not isinstance(offset, int) or offset < 0:
        return None
    return partition, offset
