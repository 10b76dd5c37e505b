"""Whether this replica may still act for its partitions: a tracker frozen past its session
timeout (a "zombie") must not redeliver what its successor already owns."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("kmq.tracker")


class HeartbeatGuard:
    """Redeliveries wait until a heartbeat sent within two thirds of the session timeout has
    been answered, or a join completed, and no rejoin is pending.

    This reads kafka-python's coordinator state (``heartbeat.last_send/last_receive/
    last_reset``, ``stable()``, ``need_rejoin()``); if those move, it turns itself off.
    """

    def __init__(self, consumer: Any, session_timeout_ms: int) -> None:
        self._consumer = consumer
        self._window_s = session_timeout_ms / 1000 * 2 / 3
        self._confirmed_at = float("-inf")
        self._ok = True

    def current(self, now: float) -> bool:
        confirmed_at = membership_confirmed_at(self._consumer, self._confirmed_at)
        if confirmed_at is None:
            return True  # not a kafka-python we know: nothing to judge by
        self._confirmed_at = confirmed_at
        current = now - confirmed_at < self._window_s
        if current != self._ok:
            self._ok = current
            if current:
                log.info("group membership confirmed again: redeliveries resume")
            else:
                log.warning(
                    "no heartbeat answered for %.1f s: holding redeliveries until the group "
                    "confirms this replica (another may own its partitions now)",
                    now - confirmed_at,
                )
        return current


def membership_confirmed_at(consumer: Any, known: float) -> float | None:
    """Monotonic time at which ``consumer``'s group coordinator last surely counted it a
    member in good standing: the *send* time of the latest answered heartbeat (an answer
    processed late, after a freeze, says nothing about the freeze), or a completed join.
    ``known`` is what the previous call returned. -inf while it is not a member in good
    standing (rejoining, asked to rejoin, kicked out); None if this kafka-python keeps none
    of this where we look."""
    coordinator = getattr(consumer, "_coordinator", None)
    heartbeat = getattr(coordinator, "heartbeat", None)
    stable = getattr(coordinator, "stable", None)
    need_rejoin = getattr(coordinator, "need_rejoin", None)
    times = [getattr(heartbeat, name, None) for name in ("last_send", "last_receive", "last_reset")]
    if not (callable(stable) and callable(need_rejoin)) or not all(
        isinstance(t, float) for t in times
    ):
        return None
    last_send, last_receive, last_reset = (float(t) for t in times)  # type: ignore[arg-type]
    if not stable() or need_rejoin():
        return float("-inf")
    confirmed = max(known, last_reset)
    if last_receive >= last_send:  # the latest heartbeat was answered (the loop is serial)
        confirmed = max(confirmed, last_send)
    return confirmed
