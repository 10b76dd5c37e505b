"""Entry point of the chaos suite's child processes: ``python -m tests.chaos.worker ROLE ...``.

``--clock-skew-s S`` moves this process's wall clock (``time.time``) S seconds away from the
real one before kafka-python is imported, so every record the process writes (queue records
from a producer, markers from a worker) carries a timestamp that far off. The ledger the
process keeps uses the real clock. Roles and options: :mod:`tests.chaos.roles`.
"""

from __future__ import annotations

import sys

from tests.chaos import clock


def skew_from_argv(argv: list[str]) -> float:
    """The value of ``--clock-skew-s`` in ``argv`` (0 when absent)."""
    for i, arg in enumerate(argv):
        if arg == "--clock-skew-s" and i + 1 < len(argv):
            return float(argv[i + 1])
        if arg.startswith("--clock-skew-s="):
            return float(arg.split("=", 1)[1])
    return 0.0


if __name__ == "__main__":
    if "kafka" in sys.modules:
        raise SystemExit("kafka-python was imported before the clock could be skewed")
    clock.skew_wall_clock(skew_from_argv(sys.argv[1:]))
    from tests.chaos.roles import main

    main(sys.argv[1:])
