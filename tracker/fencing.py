"""Fencing: only the current owner of a markers partition can redeliver from it.

Each owned markers partition gets a transactional producer whose transactional id names the
partition (``<group>.<markers topic>.<partition>``). A replica that is assigned the
partition calls ``init_transactions()`` with that id, which bumps the producer epoch: the
broker then refuses every transaction of the previous owner, whether it is a live zombie
(frozen past its session, then woken) or just slow. Every redelivery (the copies, their
markers and the markers-offset commit that skips them) is one such transaction, so a
fenced replica's redeliveries are never visible to the consumers, who read committed
records only. This holds on Apache Kafka and on the embedded Tansu broker (tested in
tests/functional/test_failures.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Set
from typing import Any

from kafka.errors import (
    InvalidProducerEpochError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
)

from kmq.errors import BrokerError
from kmq.kafka_clients import close_producer

log = logging.getLogger("kmq.tracker")

CLAIM_WAIT_S = 0.5
"""How long a claim waits for the broker's answer before the caller goes on (the request
goes on too, and a later claim waits for it again)."""
BUILD_RETRY_S = 1.0
"""After a failed producer build, how long claims that need a new producer wait."""
CLAIM_GIVE_UP_S = 5.0
"""A claim the broker has not answered in this long is given up: its producer is closed and
the next claim builds a new one. In a full chaos run a tracker waited 150 s on one claim,
sent just as a network fault reset its connection, and never answered; meanwhile the
transaction it was meant to end stayed open, so the replica (reading committed records
only) read nothing more of those markers partitions and redelivered nothing from them."""

FENCED_ERRORS: tuple[type[BaseException], ...] = (ProducerFencedError, InvalidProducerEpochError)
"""What the broker answers a fenced producer."""


def transactional_id(group_id: str, marker_topic: str, partition: int) -> str:
    return f"{group_id}.{marker_topic}.{partition}"


def is_fenced(exc: BaseException) -> bool:
    """Whether ``exc`` says another replica has claimed the partition since.

    kafka-python 3.0.12 raises the fence itself only once: after that the producer is in
    an error state, and each call raises a plain KafkaError that carries the fence as an
    argument ("Cannot perform send because at least one previous transactional or
    idempotent request has failed", from ``send()``) or only in its text ("Cannot execute
    transactional method because we are in an error state: [Error 90]
    ProducerFencedError", from ``begin_transaction()``). A fence first met by the
    producer's I/O thread (a send's partition added to the transaction) reaches the caller
    only in these forms: in a full chaos run, a replica took one for an ordinary failure
    and retried with its fenced producer for 50 s."""
    if isinstance(exc, FENCED_ERRORS):
        return True
    if not isinstance(exc, KafkaError):
        return False
    if any(isinstance(arg, FENCED_ERRORS) for arg in exc.args):
        return True
    if isinstance(exc.__cause__, FENCED_ERRORS):
        return True
    text = " ".join(str(arg) for arg in exc.args)
    return any(cls.__name__ in text for cls in FENCED_ERRORS)


class PartitionWriters:
    """The transactional producer of each markers partition this replica owns.

    ``make(transactional_id)`` builds a producer (a KafkaProducer in the daemon, a stub in
    tests). :meth:`claim` must succeed before the partition's first redelivery.
    """

    def __init__(
        self,
        make: Callable[[str], Any],
        group_id: str,
        marker_topic: str,
        init: Callable[[Any, float], None] = lambda producer, wait_s: producer.init_transactions(),
        clock: Callable[[], float] = time.monotonic,
        wait_s: float = CLAIM_WAIT_S,
    ) -> None:
        self._make = make
        self._init = init
        """``init(producer, wait_s)``: init_transactions(), waiting at most ``wait_s``."""
        self._wait_s = wait_s
        self._clock = clock
        self._no_build_until = float("-inf")
        """After a producer could not be built (Kafka unreachable), no other partition's
        claim tries again before this: each try may hold the caller up to its timeout."""
        self._group_id = group_id
        self._marker_topic = marker_topic
        self._producers: dict[int, Any] = {}
        self._pending: dict[int, tuple[Any, float, bool]] = {}
        """Claims the broker has not answered yet, with when they were sent and whether
        that was logged: the next claim() waits on for the same request rather than
        blocking the caller until it is answered, up to ``CLAIM_GIVE_UP_S``."""

    def claim(self, partition: int) -> bool:
        """Take the partition's transactional id (fencing its previous owner). False, and
        nothing claimed, if the broker could not be reached or has not answered within
        ``wait_s``: try again later (after a timeout, the same request goes on)."""
        return self._claim(partition, self._wait_s)

    def claim_many(self, partitions: Iterable[int]) -> set[int]:
        """:meth:`claim` each of ``partitions``, their requests sent together and waited
        for within one ``wait_s`` in all, not one each: a replica taking over several
        partitions whose claims the broker answers slowly (it first ends the previous
        owner's transaction) is held up once. Returns the partitions claimed."""
        todo = [p for p in dict.fromkeys(partitions) if p not in self._producers]
        if not todo:
            return set()
        if len(todo) > 1:
            for partition in todo:
                self._claim(partition, 0.0, quiet=True)  # send it, then on to the next
        deadline = self._clock() + self._wait_s
        for partition in todo:
            if partition not in self._producers:
                self._claim(partition, max(0.0, deadline - self._clock()))
        return {p for p in todo if p in self._producers}

    def _claim(self, partition: int, wait_s: float, quiet: bool = False) -> bool:
        if partition in self._producers:
            return True
        txn_id = transactional_id(self._group_id, self._marker_topic, partition)
        now = self._clock()
        producer, sent_at, told = self._pending.pop(partition, (None, now, False))
        if producer is not None and now - sent_at >= CLAIM_GIVE_UP_S:
            log.warning(
                "markers partition %d: claim of %s not answered in %.0f s: trying again "
                "with a new producer", partition, txn_id, now - sent_at,
            )  # fmt: skip
            with contextlib.suppress(Exception):
                close_producer(producer, 0)
            producer, sent_at, told = None, now, False
        if producer is None and now < self._no_build_until:
            return False
        try:
            if producer is None:
                producer = self._make(txn_id)
            self._init(producer, wait_s)
        except KafkaTimeoutError as exc:
            tell = not told and not quiet  # once per request, once it was waited for
            (log.warning if tell else log.debug)(
                "markers partition %d: claim of %s not answered yet (%r)", partition, txn_id, exc
            )
            if producer is not None:
                self._pending[partition] = (producer, sent_at, told or tell)
            return False
        except (KafkaError, BrokerError) as exc:  # BrokerError: the producer was not built
            log.warning("markers partition %d: cannot claim %s yet (%r)", partition, txn_id, exc)
            if producer is None:
                self._no_build_until = self._clock() + BUILD_RETRY_S
            else:
                with contextlib.suppress(Exception):
                    close_producer(producer, 1)
            return False
        self._producers[partition] = producer
        return True

    def get(self, partition: int) -> Any | None:
        return self._producers.get(partition)

    def claimed(self) -> set[int]:
        return set(self._producers)

    def release(self, partition: int, timeout_s: float = 5.0) -> None:
        pending = self._pending.pop(partition, None)
        for producer in (self._producers.pop(partition, None), pending and pending[0]):
            if producer is not None:
                with contextlib.suppress(Exception):
                    close_producer(producer, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        for partition in set(self._producers) | set(self._pending):
            self.release(partition, timeout_s)


class FenceWatch:
    """The markers partitions this replica was fenced on, until the group settles them.

    Another replica's claim fences this one (see :class:`PartitionWriters`), and this one
    drops the partition. Usually the group then revokes it here too. But a claim can come
    from an assignment the group has since undone (a replica that lost its session and
    rejoined, say), and then the partition comes back to this replica; under cooperative
    rebalancing a member is told nothing about a partition it keeps, so nobody would track
    it again. :meth:`retake` names the partitions the group still gives this replica in a
    generation later than the fence, seen on two rounds in a row (kafka-python marks the
    member stable a moment before it applies the new assignment).

    A claim can also come from a replica that took the partition up while this one was
    silent (frozen a few seconds, say; :mod:`tracker.orphans`), in the same generation. If
    this one was a real zombie, its generation is gone and its next heartbeat says so:
    within a session it rejoins, and the generation moves on. So a partition the group
    still gives it, the member stable throughout, in the generation of the fence
    ``settle_s`` (the session) after it, is taken up again too. Pure: no I/O.
    """

    def __init__(self, settle_s: float = float("inf")) -> None:
        self.settle_s = settle_s
        self._fenced: dict[int, int] = {}  # partition -> generation when it was fenced
        self._seen: dict[int, int] = {}  # partition -> a later generation, seen once
        self._since: dict[int, float] = {}  # partition -> stable in that generation since

    def fenced(self, partition: int, generation: int, now: float = 0.0) -> None:
        self._fenced[partition] = generation
        self._seen.pop(partition, None)
        self._since[partition] = now

    def forget(self, partition: int) -> None:
        """The group assigned the partition afresh (the listener said so)."""
        self._fenced.pop(partition, None)
        self._seen.pop(partition, None)
        self._since.pop(partition, None)

    def watching(self) -> set[int]:
        return set(self._fenced)

    def retake(
        self,
        assigned: set[int],
        generation: int,
        stable: bool,
        now: float = 0.0,
        held_elsewhere: Set[int] = frozenset(),
    ) -> list[int]:
        """The fenced partitions to take up again now (each once).

        In the generation of the fence, one in ``held_elsewhere`` (another live replica
        says it holds it: the adopter) is left to that replica: taking it back would fence
        the adopter and replay the partition once more, while its leases wait (in a full
        chaos run, three owners in 7 s held copies 11 s past their lease). Should the
        adopter fall silent, it is an orphan again (:mod:`tracker.orphans`); the group's
        next assignment settles who keeps it."""
        back: list[int] = []
        for partition, at in list(self._fenced.items()):
            if partition not in assigned:
                self.forget(partition)  # the group has moved it; an assignment will say
            elif not stable or generation < at:
                self._seen.pop(partition, None)
                self._since[partition] = now  # the same generation must settle afresh
            elif generation == at:
                self._seen.pop(partition, None)
                if partition in held_elsewhere:
                    continue
                if now - self._since[partition] >= self.settle_s:
                    self.forget(partition)
                    back.append(partition)
            elif self._seen.get(partition) == generation:
                self.forget(partition)
                back.append(partition)
            else:
                self._seen[partition] = generation
        return sorted(back)


class Tenure:
    """The group generation in which each partition this replica tracks was last its own
    (assigned, or adopted while the group was at that generation).

    A partition kept through a rebalance and assigned to this replica in the very next
    generation was given to no other replica in between, so its claim still stands: it
    needs no new claim, nor a probe written after one, before its next redelivery. Any
    other gap (a generation this replica missed, or an adoption and an assignment further
    apart) is claimed anew. Either way the fence keeps it safe: a replica that claimed the
    partition outside the group meanwhile (adopting it from this one while it was silent)
    fences this one's next transaction: the partition is dropped and taken up again
    (:class:`FenceWatch`), whether kafka-python raises the fence as such or reports it as
    a plain "error state" KafkaError (:func:`is_fenced`).
    """

    def __init__(self) -> None:
        self._since: dict[int, int] = {}

    def held(self, partitions: Iterable[int], generation: int) -> None:
        for partition in partitions:
            self._since[partition] = generation

    def forget(self, partition: int) -> None:
        self._since.pop(partition, None)

    def unbroken(self, partitions: Iterable[int], generation: int | None) -> set[int]:
        """Those of ``partitions`` (kept, assigned in ``generation``) held in the
        generation just before it; none when the generation is not known."""
        if generation is None or generation < 1:
            return set()
        return {p for p in partitions if self._since.get(p) == generation - 1}
