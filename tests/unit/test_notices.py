"""The tracker's ``unread`` notices on the control topic (tracker.notices)."""

from __future__ import annotations

from tracker.notices import CHECK_EVERY_S, RESEND_AFTER_S, UnreadNotices


def nobody(queue: str) -> bool:
    return False


def everyone(queue: str) -> bool:
    return True


def test_an_unread_copy_is_noticed_once_and_again_only_after_the_resend_time() -> None:
    notices = UnreadNotices()
    notices.unread("q", 2)
    notices.unread("q", 2)
    assert notices.changes([], nobody, 0.0) == ([("q", 2)], [])
    notices.unread("q", 2)
    assert notices.changes([], nobody, CHECK_EVERY_S) == ([], []), "on its way"
    notices.unread("q", 2)
    assert notices.changes([], nobody, RESEND_AFTER_S) == ([("q", 2)], []), "lost: again"


def test_checks_are_paced() -> None:
    notices = UnreadNotices()
    assert notices.due(0.0)
    assert notices.changes([], nobody, 0.0) == ([], [])
    assert not notices.due(CHECK_EVERY_S / 2) and notices.due(CHECK_EVERY_S)
    notices.unread("q", 1)
    assert notices.changes([], nobody, CHECK_EVERY_S / 2) == ([], [])
    assert notices.changes([], nobody, CHECK_EVERY_S) == ([("q", 1)], []), "kept until then"


def test_a_standing_notice_is_not_written_again() -> None:
    notices = UnreadNotices()
    notices.unread("q", 1)
    assert notices.changes([("q", 1)], nobody, 0.0) == ([], [])


def test_no_notice_when_a_reader_is_heard_and_standing_ones_are_withdrawn() -> None:
    notices = UnreadNotices()
    notices.unread("q", 1)
    assert notices.changes([("q", 1), ("r", 0)], lambda q: q == "q", 0.0) == ([], [("q", 1)])
    assert notices.changes([("q", 1)], everyone, CHECK_EVERY_S) == ([], []), "on its way"
    assert notices.changes([("q", 1)], everyone, RESEND_AFTER_S) == ([], [("q", 1)])


def test_a_notice_withdrawn_can_be_written_again_at_once() -> None:
    notices = UnreadNotices()
    notices.unread("q", 1)
    assert notices.changes([], nobody, 0.0) == ([("q", 1)], [])
    assert notices.changes([("q", 1)], everyone, CHECK_EVERY_S) == ([], [("q", 1)])
    notices.unread("q", 1)
    assert notices.changes([], nobody, 2 * CHECK_EVERY_S) == ([("q", 1)], []), (
        "its readers went again: said at once"
    )
