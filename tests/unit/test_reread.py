"""Re-reading due records: which offsets one forward scan covers (tracker.reread.clusters)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.reread import SCAN_GAP, clusters


@pytest.mark.parametrize(
    ("offsets", "gap", "expected"),
    [
        ([], 10, []),
        ([5], 10, [[5]]),
        ([5, 5, 5], 10, [[5]]),
        ([3, 1, 2], 10, [[1, 2, 3]]),
        ([0, 10], 10, [[0, 10]]),  # exactly the gap apart: one scan
        ([0, 11], 10, [[0], [11]]),
        ([0, 10, 20, 31, 41, 100], 10, [[0, 10, 20], [31, 41], [100]]),
        ([100, 0], 0, [[0], [100]]),
        ([7, 7, 8], 0, [[7], [8]]),
        ([0, SCAN_GAP], SCAN_GAP, [[0, SCAN_GAP]]),
    ],
)
def test_clusters(offsets: list[int], gap: int, expected: list[list[int]]) -> None:
    assert clusters(offsets, gap) == expected


def test_default_gap() -> None:
    assert SCAN_GAP == 5000
    assert clusters([0, 5000, 10_001]) == [[0, 5000], [10_001]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**6)), st.integers(0, 10**5))
def test_clusters_partition_the_sorted_offsets(offsets: list[int], gap: int) -> None:
    out = clusters(offsets, gap)
    assert [o for c in out for o in c] == sorted(set(offsets))
    for cluster in out:
        assert cluster
        assert all(b - a <= gap for a, b in itertools.pairwise(cluster))
    for before, after in itertools.pairwise(out):
        assert after[0] - before[-1] > gap
