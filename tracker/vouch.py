"""Owns entries written for a run loop that is busy, so a live replica is not adopted from.

A replica's beacons, and the *owns* entries beside them (:mod:`tracker.orphans`), go out
from its run loop once a second. One turn of that loop can last seconds on a loaded
machine: a redelivery round whose re-reads take 3 to 5 s, a transaction, a group join. In
full chaos run 51, with turns of up to 11.8 s, 14 of 38 adoptions came with no tracker
killed, and in the worst of them two live replicas adopted each other's partitions in
turn, fencing each other: three changes of owner in 20 s, and 90 copies 20 s beyond their
lease. Adopting from a busy owner gains nothing: the adopter must claim, replay and probe
before it redelivers, about as long as the owner's turn, and the owner loses its work.

So a small thread (:class:`Voucher`) writes the owns entries while the loop is late with
its beacon, as long as the loop's current turn is younger than :data:`VOUCH_TURN_S`. A
replica that is frozen or killed writes nothing (its threads stop with it), and one whose
loop is stuck for longer is adopted from as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tracker.handover import BEACON_S

log = logging.getLogger("kmq.tracker")

VOUCH_TURN_S = 15.0
"""A turn older than this is not vouched for: its partitions are adopted as if the replica
were silent. Longer than the slowest turn of full chaos run 51 (11.8 s), far shorter than
the liveness probe's default 60 s."""
SLACK_S = BEACON_S / 2
"""How late the loop's beacon must be before the thread writes in its place: an idle loop
waits up to two polls of 100 ms between turns, which must not set the thread writing."""


def vouch_due(
    now: float,
    next_beacon: float,
    last_vouch: float,
    turn_started: float,
    turn_s: float = VOUCH_TURN_S,
) -> bool:
    """Whether to write owns entries now: the loop's beacon was due at ``next_beacon`` and
    is :data:`SLACK_S` late, none was vouched in the last :data:`BEACON_S`, and the loop's
    current turn, begun at ``turn_started``, is younger than ``turn_s``. (Owns entries then
    go out 1.5 s after the last beacon and each second after that: within the 2 s of
    silence after which a replica is adopted from.)"""
    return (
        now >= next_beacon + SLACK_S
        and now >= last_vouch + BEACON_S
        and now - turn_started < turn_s
    )


class Voucher:
    """Calls ``vouch(now)`` whenever ``due(now, last vouch)`` says so, checking every
    quarter beacon, on a daemon thread of its own until :meth:`close`. Errors are logged
    and passed over: a vouch is a courtesy, the next beacon says the same."""

    def __init__(
        self,
        due: Callable[[float, float], bool],
        vouch: Callable[[float], None],
        period_s: float = BEACON_S / 4,
    ) -> None:
        self._due = due
        self._vouch = vouch
        self._period_s = period_s
        self._stop = threading.Event()
        self.last = float("-inf")
        """When it last vouched (monotonic)."""
        self._thread = threading.Thread(target=self._run, name="kmq-tracker-vouch", daemon=True)

    def start(self) -> Voucher:
        self._thread.start()
        return self

    def step(self, now: float) -> bool:
        """One check; True if it vouched (the thread's body, callable from a test)."""
        if not self._due(now, self.last):
            return False
        try:
            self._vouch(now)
        except Exception as exc:  # a busy or unreachable broker: the next beacon says it
            log.debug("owns entries not vouched (%r)", exc)
            return False
        self.last = now
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.step(time.monotonic())

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1.0)
