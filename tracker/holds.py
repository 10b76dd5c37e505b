"""Why a markers partition's overdue leases have not gone out yet, said once while it lasts.
Pure: the adapter passes what it knows; no I/O, no clock.

A lease overdue by seconds waits on one of the gates a redelivery passes (the queues'
layouts read, no rebalance holding, the replay over, the partition claimed, a probe read
back). Each is right to wait on, but a full chaos run showed one partition's overdue
leases waiting 2.3 s with nothing in the logs to say which gate held them."""

from __future__ import annotations

HELD_LOG_S = 3.0
"""How far past its deadline a partition's earliest lease is before its hold is logged:
more than a round or two of a busy tracker (a probe read back takes about one)."""


def hold_reason(
    *,
    layouts_known: bool,
    rebalance_holds: bool,
    replaying: bool,
    claimed: bool,
    reclaiming: bool,
    due_by_log: bool,
) -> str | None:
    """The first gate an overdue lease of the partition waits on; ``None`` if none does
    (it goes out in this round, or the next one the round's budget leaves it to)."""
    if not layouts_known:
        return "the queues' layouts are not read yet"
    if rebalance_holds:
        return "a rebalance holds every redelivery"
    if replaying:
        return "its replay is not over"
    if not claimed:
        return "it is not claimed yet (its last holder has not let go)"
    if reclaiming:
        return "claimed again, it waits to read back a probe written after the claim"
    if not due_by_log:
        return "not due by the log yet: it waits to read back a probe"
    return None


class HeldLeases:
    """Says each partition's hold once per reason, while its earliest lease stays more
    than ``after_s`` overdue."""

    def __init__(self, after_s: float = HELD_LOG_S) -> None:
        self.after_s = after_s
        self._said: dict[int, str] = {}

    def observe(self, partition: int, overdue_s: float | None, reason: str | None) -> str | None:
        """``overdue_s``: how far past its deadline the partition's earliest lease is
        (``None``: none in flight). The reason to log now, or ``None``."""
        if overdue_s is None or overdue_s < self.after_s or reason is None:
            self._said.pop(partition, None)
            return None
        if self._said.get(partition) == reason:
            return None
        self._said[partition] = reason
        return reason

    def forget(self, partition: int) -> None:
        self._said.pop(partition, None)
