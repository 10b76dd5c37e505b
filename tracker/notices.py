"""Telling consumers which retry partitions nobody reads: the control topic's ``unread``
notices (:mod:`kmq.control`, read by :mod:`kmq.adopted`).

A copy written while no consumer of its queue is heard reading any retry partition
(every reader killed, say) is *unread*: the tracker says so, and a consumer that reads
nothing of that queue's retry lane reads the partition until its group settles. The notice
is withdrawn once a reader of the queue is heard again, by whichever replica hears it.
Pure: no I/O, time passed in; the daemon writes what :meth:`UnreadNotices.changes` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Notice = tuple[str, int]
"""(queue, retry partition)."""

CHECK_EVERY_S = 0.5
RESEND_AFTER_S = 2.0
"""A notice (or withdrawal) already sent is not sent again for this long: time for it to
be read back from the control topic."""


class UnreadNotices:
    """The notices this replica wants written or withdrawn."""

    def __init__(self) -> None:
        self._unread: set[Notice] = set()
        self._sent: dict[Notice, tuple[bool, float]] = {}
        self._next_check = 0.0

    def unread(self, queue: str, partition: int) -> None:
        """A copy for ``queue`` is on retry partition ``partition`` with no reader heard."""
        self._unread.add((queue, partition))

    def due(self, now: float) -> bool:
        """Whether :meth:`changes` would look now."""
        return now >= self._next_check

    def changes(
        self, standing: Iterable[Notice], live: Callable[[str], bool], now: float
    ) -> tuple[list[Notice], list[Notice]]:
        """(notices to write, notices to withdraw), at most every ``CHECK_EVERY_S``.
        ``standing``: those on the control topic as read; ``live(queue)``: whether some
        consumer of ``queue`` is heard reading its retry lane."""
        if now < self._next_check:
            return [], []
        self._next_check = now + CHECK_EVERY_S
        self._sent = {n: s for n, s in self._sent.items() if now - s[1] < RESEND_AFTER_S}
        standing = set(standing)
        withdraw = [n for n in sorted(standing) if live(n[0]) and self._send(n, False, now)]
        write = [
            n
            for n in sorted(self._unread - standing)
            if not live(n[0]) and self._send(n, True, now)
        ]
        self._unread.clear()  # a copy still unread is said so again (unread-copy checks)
        return write, withdraw

    def _send(self, notice: Notice, value: bool, now: float) -> bool:
        if self._sent.get(notice, (not value, 0.0))[0] == value:
            return False
        self._sent[notice] = (value, now)
        return True
