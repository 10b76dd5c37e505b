"""The real wall clock, captured before a chaos process skews ``time.time``.

Import this module before anything else in a child process (it imports only :mod:`time`),
then call :func:`skew_wall_clock` before kafka-python is imported: kafka-python binds
``time.time`` when its record module loads and stamps every record it writes with it.
"""

from __future__ import annotations

import time

real_time = time.time
"""The unskewed wall clock; ledgers record these times."""


def skew_wall_clock(seconds: float) -> None:
    """Make ``time.time()`` run ``seconds`` ahead (or behind, if negative) of the real clock."""
    if not seconds:
        return

    def skewed() -> float:
        return real_time() + seconds

    time.time = skewed
