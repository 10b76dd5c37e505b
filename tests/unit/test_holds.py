"""Why a partition's overdue leases wait (tracker.holds): the first gate, said once."""

from __future__ import annotations

import pytest

from tracker.holds import HeldLeases, hold_reason

OPEN = {
    "layouts_known": True,
    "rebalance_holds": False,
    "replaying": False,
    "claimed": True,
    "reclaiming": False,
    "due_by_log": True,
}


@pytest.mark.parametrize(
    ("closed", "said"),
    [
        ({}, None),
        ({"due_by_log": False}, "not due by the log yet"),
        ({"reclaiming": True, "due_by_log": False}, "claimed again"),
        ({"claimed": False, "reclaiming": True}, "not claimed yet"),
        ({"replaying": True, "claimed": False}, "replay is not over"),
        ({"rebalance_holds": True, "replaying": True}, "a rebalance holds"),
        ({"layouts_known": False, "rebalance_holds": True}, "layouts are not read"),
    ],
)
def test_the_first_closed_gate_is_the_reason(closed: dict[str, bool], said: str | None) -> None:
    reason = hold_reason(**{**OPEN, **closed})
    assert reason is None if said is None else reason is not None and said in reason


def test_a_hold_is_said_once_per_reason_while_it_lasts() -> None:
    held = HeldLeases(after_s=3.0)
    assert held.observe(1, 2.9, "x") is None, "not overdue long enough"
    assert held.observe(1, 3.0, "x") == "x"
    assert held.observe(1, 4.0, "x") is None, "said already"
    assert held.observe(2, 5.0, "x") == "x", "each partition on its own"
    assert held.observe(1, 5.0, "y") == "y", "another gate"
    assert held.observe(1, None, None) is None  # redelivered: nothing in flight
    assert held.observe(1, 3.5, "y") == "y", "a new spell is said again"
    assert held.observe(1, 6.0, None) is None  # the gate opened
    assert held.observe(1, 6.5, "y") == "y"
    held.forget(1)
    assert held.observe(1, 7.0, "y") == "y"
