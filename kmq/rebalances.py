"""Group rebalances: counting what a member gives up (see ``Consumer.partitions_given_up``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kafka import ConsumerRebalanceListener


class GivenUp(ConsumerRebalanceListener):  # type: ignore[misc]
    """Partitions revoked from, or lost by, one Kafka consumer since it started. Called on
    that consumer's poll thread; read from any thread (an int, replaced whole)."""

    def __init__(self) -> None:
        self.count = 0

    def on_partitions_revoked(self, revoked: Collection[Any]) -> None:
        self.count += len(revoked)

    def on_partitions_assigned(self, assigned: Collection[Any]) -> None:
        pass

    def on_partitions_lost(self, lost: Collection[Any]) -> None:
        self.count += len(lost)

