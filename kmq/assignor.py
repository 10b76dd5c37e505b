"""A consumer-group partition assignor that assigns only the partitions members ask for.

Each member of a queue's group declares, in its subscription's user data, the partitions
its queue's layout says to read (:func:`kmq.layout.read_partitions`). The leader assigns
each declared partition to one member that declared it, evening out the counts; a
partition no member declares stays unassigned (the classic group protocol allows that), so
the group never fetches it. A member that declares nothing readable (another client) is
taken to want every partition of its topics.

Cooperative (the default, KIP-429 incremental rebalancing): members keep their partitions
through a rebalance and go on reading them; the leader leaves each partition with its owner
unless the counts must be evened out, and a partition that moves is first taken from its
owner and given to the new one only in the next round, so no two members read it at once.
A member killed or joining then stops only the partitions it owned or gets, not the whole
group (eager rebalancing revokes every partition of every member at every join).

A cooperative member also says which spare retry-lane partitions it reads
(:func:`kmq.layout.spare_candidates`), and the leader gives each member that owns none of
the queue's partitions one nobody reads (:func:`assign_spares`), in the assignment's user
data. Members and leaders of earlier releases send and give none.

Eager members also offer kafka-python's range assignor, after this one: a group that still
has members of kmq 0.1 (range only) then agrees on range, and everyone reads everything, as
0.1 did. Cooperative members cannot (kafka-python needs one rebalance protocol for all of a
consumer's assignors), so a group mixing 0.1 members needs ``rebalance="eager"``.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, RebalanceProtocol
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

log = logging.getLogger(__name__)

NAME = "kmq-layout"
_VERSION = 0
_COOPERATIVE_VERSION = 1
"""Subscription version 1 carries the partitions a member owns (KIP-429)."""

Declared = Mapping[str, Iterable[int]]
"""Partitions a member wants, by topic."""

Partition = tuple[str, int]


def encode_declared(declared: Declared, spares: Collection[int] | None = None) -> bytes:
    """A member's subscription user data: what it asks for, and (if it can read spares at
    all) the spare retry partitions it reads now."""
    doc: dict[str, Any] = {"v": 1, "t": {t: sorted(ps) for t, ps in declared.items()}}
    if spares is not None:
        doc["s"] = sorted(spares)
    return json.dumps(doc).encode()


def decode_spares(data: bytes | None) -> set[int] | None:
    """The spares a member reads, from its subscription's or its assignment's user data;
    ``None`` if it says nothing of spares (a member or leader of an earlier release)."""
    if not data:
        return None
    try:
        listed = json.loads(data)["s"]
        spares = {int(p) for p in listed}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return spares if all(p >= 0 for p in spares) else None


def encode_spares(spares: Collection[int]) -> bytes:
    """An assignment's user data: the spares its member is to read."""
    return json.dumps({"v": 1, "s": sorted(spares)}).encode()


def decode_declared(data: bytes | None) -> dict[str, set[int]] | None:
    if not data:
        return None
    try:
        doc = json.loads(data)
        topics = doc["t"]
        return {str(t): {int(p) for p in ps} for t, ps in topics.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _weight(tp: Partition, member_id: str) -> int:
    """The rendezvous weight of ``member_id`` for ``tp``: equally loaded members that want a
    partition get it by the highest weight. The same on every leader (crc32, not hash())."""
    return zlib.crc32(f"{tp[0]}\0{tp[1]}\0{member_id}".encode())


def assign(
    members: list[tuple[str, set[str], dict[str, set[int]] | None]],
    partitions_of: Mapping[str, set[int]],
    owned: Mapping[str, Iterable[Partition]] | None = None,
    preferred: Collection[str] = (),
    spare_readers: Collection[str] = (),
) -> dict[str, dict[str, list[int]]]:
    """Pure assignment. ``members``: (member id, subscribed topics, declared partitions or
    ``None`` for "all"); ``partitions_of``: what exists.

    A partition goes to the least loaded member that wants it; among equally loaded ones
    ``preferred`` members (static ones) first, then members not in ``spare_readers``, then
    the highest :func:`_weight`. Not member order: every group of a process would then
    break its ties the same way, and the member whose id sorts first (a client id, a
    restarted worker's new member) would win every tie of every queue while an equally idle
    member got nothing. A spare's reader keeps its spare when it gets a partition (a spare
    never moves between live members), so giving the partition to an idle member without
    one instead keeps a spare read by an idle member, which takes the copies of a queue
    whose owners were all killed (see :func:`assign_spares`). This outranks spreading the
    ties: a restarted worker, which reads no spare yet, takes what its predecessor left in
    every queue whose idle member reads one.

    ``owned`` (cooperative rebalancing): what each member reads now. A partition stays with
    its owner while that owner still wants it and the counts stay within one of each other;
    a partition that must move is left out of this round (its owner gives it up and rejoins,
    and the next round, where nobody owns it, gives it to its new owner). ``None``: eager,
    every partition placed afresh.
    """
    wanted: dict[Partition, list[str]] = {}
    for member_id, topics, declared in members:
        for topic in topics:
            existing = partitions_of.get(topic, set())
            asked = existing if declared is None else declared.get(topic, set()) & existing
            for partition in asked:
                wanted.setdefault((topic, partition), []).append(member_id)
    load = {member_id: 0 for member_id, _, _ in members}
    # Who reads each partition now (the first claimant in member order, should two claim it).
    holder: dict[Partition, str] = {}
    for member_id, _, _ in members:
        for tp in (owned or {}).get(member_id, ()):
            holder.setdefault(tp, member_id)
    owner: dict[Partition, str] = {}
    for tp, member_id in sorted(holder.items()):
        if tp not in owner and member_id in wanted.get(tp, ()):
            owner[tp] = member_id
            load[member_id] += 1
    for tp, candidates in sorted(wanted.items()):
        if tp not in owner:
            chosen = _lightest(tp, candidates, load, preferred, spare_readers)
            load[chosen] += 1
            owner[tp] = chosen
    if owned is not None:
        _even_out(owner, wanted, load, holder, preferred, spare_readers)
    out: dict[str, dict[str, list[int]]] = {member_id: {} for member_id, _, _ in members}
    for (topic, partition), member_id in sorted(owner.items()):
        if holder.get((topic, partition), member_id) != member_id:
            continue  # moving: its holder gives it up first
        out[member_id].setdefault(topic, []).append(partition)
    return out


def _lightest(
    tp: Partition,
    candidates: Iterable[str],
    load: Mapping[str, int],
    preferred: Collection[str],
    spare_readers: Collection[str],
) -> str:
    return min(
        candidates,
        key=lambda m: (load[m], m not in preferred, m in spare_readers, -_weight(tp, m), m),
    )


def _even_out(
    owner: dict[Partition, str],
    wanted: Mapping[Partition, list[str]],
    load: dict[str, int],
    holder: Mapping[Partition, str],
    preferred: Collection[str],
    spare_readers: Collection[str],
) -> None:
    """Move partitions from a member to a less loaded one that wants them while the two
    differ by two or more; partitions nobody holds yet move first. Each move lowers the sum
    of squared loads, so this ends."""
    order = sorted(owner, key=lambda tp: (tp in holder, tp))
    moved = True
    while moved:
        moved = False
        for tp in order:
            current = owner[tp]
            lightest = _lightest(tp, wanted[tp], load, preferred, spare_readers)
            if load[current] - load[lightest] >= 2:
                owner[tp] = lightest
                load[current] -= 1
                load[lightest] += 1
                moved = True


def assign_spares(
    members: Sequence[tuple[str, Collection[int] | None]],
    load: Mapping[str, int],
    candidates: Collection[int],
) -> dict[str, list[int]]:
    """Pure: spare retry partitions for the ``members`` (id, the spares it reads now, or
    ``None`` if it cannot read any) given ``load`` (queue partitions each is assigned).

    A member keeps the spares it reads that are still ``candidates``; one claimed twice
    stays with the first. A member that is assigned no queue partition and reads no spare
    gets one that nobody reads. A spare never moves from one member to another while both
    are in the group, so no two ever read one at once: it is freed when its member leaves
    (or it stops being a candidate), for a later round. Members that cannot read spares get
    no entry."""
    out: dict[str, list[int]] = {m: [] for m, held in members if held is not None}
    taken: set[int] = set()
    for member_id, held in members:
        for partition in sorted(held or ()):
            if partition in candidates and partition not in taken:
                out[member_id].append(partition)
                taken.add(partition)
    free = sorted(set(candidates) - taken)
    for member_id, held in members:
        if not free:
            break
        if held is None or out[member_id] or load.get(member_id, 0) > 0:
            continue
        chosen = max(free, key=lambda p: _weight(("", p), member_id))
        free.remove(chosen)
        out[member_id].append(chosen)
    return out


class LayoutAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """kafka-python's side of :func:`assign`. ``declared()`` is asked at every join.

    ``owned()``, given for cooperative rebalancing, is what the member reads now (its
    consumer's assignment); members send it along (subscription version 1) so the leader
    can keep each partition where it is.

    ``spares()`` (cooperative only) gives the queue's spare candidates and the spares the
    member reads now; ``on_spares`` is told the spares each assignment gives it (none when
    the leader is of an earlier release). See :func:`assign_spares`.
    """

    name = NAME

    def __init__(
        self,
        declared: Callable[[], Declared],
        owned: Callable[[], Iterable[Any]] | None = None,
        spares: Callable[[], tuple[Collection[int], Collection[int]]] | None = None,
        on_spares: Callable[[frozenset[int]], None] | None = None,
    ) -> None:
        self._declared = declared
        self._owned = owned
        self._spares = spares if owned is not None else None
        self._on_spares = on_spares
        self.version = _VERSION if owned is None else _COOPERATIVE_VERSION

    def supported_protocols(self) -> list[RebalanceProtocol]:
        if self._owned is None:
            return [RebalanceProtocol.EAGER]
        return [RebalanceProtocol.COOPERATIVE]

    def metadata(self, topics: Iterable[str]) -> Any:
        spares = None if self._spares is None else self._spares()[1]
        declared = encode_declared(self._declared(), spares)
        if self._owned is None:
            return ConsumerProtocolSubscription(_VERSION, sorted(topics), declared)
        by_topic: dict[str, list[int]] = {}
        for tp in self._owned():
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        entry = ConsumerProtocolSubscription.TopicPartition
        return ConsumerProtocolSubscription(
            version=_COOPERATIVE_VERSION,
            topics=sorted(topics),
            user_data=declared,
            owned_partitions=[
                entry(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())
            ],
        )

    def assign(self, cluster: Any, members: list[Any]) -> dict[str, Any]:
        rows = []
        topics: set[str] = set()
        owned: dict[str, list[Partition]] | None = None if self._owned is None else {}
        ordered = sorted(members, key=lambda m: (m.group_instance_id is None, m.member_id))
        for member in ordered:
            subscribed = set(member.metadata.topics)
            topics |= subscribed
            rows.append((member.member_id, subscribed, decode_declared(member.metadata.user_data)))
            if owned is not None:
                owned[member.member_id] = [
                    (entry.topic, partition)
                    for entry in getattr(member.metadata, "owned_partitions", None) or ()
                    for partition in entry.partitions
                ]
        partitions_of = {t: set(cluster.partitions_for_topic(t) or ()) for t in topics}
        static = {m.member_id for m in members if m.group_instance_id is not None}
        candidates = set() if self._spares is None else set(self._spares()[0])
        held = [(m.member_id, decode_spares(m.metadata.user_data)) for m in ordered]
        reading = {member_id for member_id, s in held if s and not s.isdisjoint(candidates)}
        result = assign(rows, partitions_of, owned, static, reading)
        spares: dict[str, list[int]] = {}
        if self._spares is not None:
            load = {m: sum(map(len, by_topic.values())) for m, by_topic in result.items()}
            spares = assign_spares(held, load, candidates)
        return {
            member_id: ConsumerProtocolAssignment(
                self.version,
                sorted(by_topic.items()),
                encode_spares(spares[member_id]) if member_id in spares else b"",
            )
            for member_id, by_topic in result.items()
        }

    def on_assignment(self, assignment: Any, generation: int) -> None:
        if self._on_spares is not None:
            spares = decode_spares(getattr(assignment, "user_data", None))
            self._on_spares(frozenset(spares or ()))
