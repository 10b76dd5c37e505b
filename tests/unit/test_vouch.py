"""The voucher (tracker.vouch): owns entries for a run loop that is late with its beacon,
as long as its turn is young; pure decisions with ``now`` passed in, no broker."""

from __future__ import annotations

import pytest

from tracker.handover import BEACON_S
from tracker.vouch import SLACK_S, VOUCH_TURN_S, Voucher, vouch_due

NEVER = float("-inf")

# (now, loop's next beacon due at, last vouch, current turn began at) -> due
CASES = {
    "the loop is on time": (10.0, 10.0, NEVER, 9.9, False),
    "late, but within the slack": (10.0 + SLACK_S - 0.01, 10.0, NEVER, 9.0, False),
    "late past the slack, a young turn": (10.0 + SLACK_S, 10.0, NEVER, 5.0, True),
    "vouched less than a beacon ago": (11.99, 10.0, 11.0, 5.0, False),
    "vouched a beacon ago": (12.0, 10.0, 11.0, 5.0, True),
    "a turn as old as the bound: left to adoption": (20.0, 10.0, NEVER, 20.0 - VOUCH_TURN_S, False),
    "a turn just younger than the bound": (20.0, 10.0, NEVER, 20.0 - VOUCH_TURN_S + 0.01, True),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_busy_loop_is_vouched_for_only_while_its_turn_is_young(
    case: tuple[float, float, float, float, bool],
) -> None:
    now, next_beacon, last, turn, expected = case
    assert vouch_due(now, next_beacon, last, turn) is expected


def test_a_voucher_vouches_when_due_and_remembers_when() -> None:
    calls: list[float] = []
    due = [False]
    voucher = Voucher(lambda now, last: due[0] and now >= last + BEACON_S, calls.append)
    assert not voucher.step(1.0) and calls == []
    due[0] = True
    assert voucher.step(2.0) and calls == [2.0] and voucher.last == 2.0
    assert not voucher.step(2.5), "the last vouch is passed to the check"
    assert voucher.step(3.0) and calls == [2.0, 3.0] and voucher.last == 3.0


def test_a_failing_vouch_is_passed_over_and_tried_again() -> None:
    tries: list[float] = []

    def vouch(now: float) -> None:
        tries.append(now)
        if len(tries) == 1:
            raise RuntimeError("dictionary changed size during iteration")

    voucher = Voucher(lambda now, last: True, vouch)
    assert not voucher.step(1.0) and voucher.last == NEVER, "a failure is no vouch"
    assert voucher.step(1.25) and tries == [1.0, 1.25] and voucher.last == 1.25


def test_a_voucher_thread_stops_on_close() -> None:
    voucher = Voucher(lambda now, last: False, lambda now: None, period_s=0.01).start()
    voucher.close()
    assert not voucher._thread.is_alive()
