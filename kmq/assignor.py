"""A consumer-group partition assignor that assigns only the partitions members ask for.

Each member of a queue's group declares, in its subscription's user data, the partitions
its queue's layout says to read (:func:`kmq.layout.read_partitions`). The leader assigns
each declared partition to one member that declared it, evening out the counts; a
partition no member declares stays unassigned (the classic group protocol allows that), so
the group never fetches it. A member that declares nothing readable (another client) is
taken to want every partition of its topics.

Members also offer kafka-python's range assignor, after this one: a group that still has
members of kmq 0.1 (range only) then agrees on range, and everyone reads everything, as
0.1 did.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

log = logging.getLogger(__name__)

NAME = "kmq-layout"
_VERSION = 0

Declared = Mapping[str, Iterable[int]]
"""Partitions a member wants, by topic."""


def encode_declared(declared: Declared) -> bytes:
    return json.dumps({"v": 1, "t": {t: sorted(ps) for t, ps in declared.items()}}).encode()


def decode_declared(data: bytes | None) -> dict[str, set[int]] | None:
    if not data:
        return None
    try:
        doc = json.loads(data)
        topics = doc["t"]
        return {str(t): {int(p) for p in ps} for t, ps in topics.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def assign(
    members: list[tuple[str, set[str], dict[str, set[int]] | None]],
    partitions_of: Mapping[str, set[int]],
) -> dict[str, dict[str, list[int]]]:
    """Pure assignment. ``members``: (member id, subscribed topics, declared partitions or
    ``None`` for "all"), in the order ties are broken; ``partitions_of``: what exists."""
    wanted: dict[tuple[str, int], list[str]] = {}
    for member_id, topics, declared in members:
        for topic in topics:
            existing = partitions_of.get(topic, set())
            asked = existing if declared is None else declared.get(topic, set()) & existing
            for partition in asked:
                wanted.setdefault((topic, partition), []).append(member_id)
    load = {member_id: 0 for member_id, _, _ in members}
    out: dict[str, dict[str, list[int]]] = {member_id: {} for member_id, _, _ in members}
    for (topic, partition), candidates in sorted(wanted.items()):
        chosen = min(candidates, key=lambda m: load[m])
        load[chosen] += 1
        out[chosen].setdefault(topic, []).append(partition)
    return out


class LayoutAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """kafka-python's side of :func:`assign`. ``declared()`` is asked at every join."""

    name = NAME
    version = _VERSION

    def __init__(self, declared: Callable[[], Declared]) -> None:
        self._declared = declared

    def metadata(self, topics: Iterable[str]) -> Any:
        return ConsumerProtocolSubscription(
            _VERSION, sorted(topics), encode_declared(self._declared())
        )

    def assign(self, cluster: Any, members: list[Any]) -> dict[str, Any]:
        rows = []
        topics: set[str] = set()
        ordered = sorted(members, key=lambda m: (m.group_instance_id is None, m.member_id))
        for member in ordered:
            subscribed = set(member.metadata.topics)
            topics |= subscribed
            rows.append((member.member_id, subscribed, decode_declared(member.metadata.user_data)))
        partitions_of = {t: set(cluster.partitions_for_topic(t) or ()) for t in topics}
        result = assign(rows, partitions_of)
        return {
            member_id: ConsumerProtocolAssignment(_VERSION, sorted(by_topic.items()), b"")
            for member_id, by_topic in result.items()
        }

    def on_assignment(self, assignment: Any, generation: int) -> None:
        pass
