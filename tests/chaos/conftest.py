"""The chaos suite needs no broker fixture: it starts its own Tansu behind a fault proxy."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: kmq under kills, fail-overs, network faults and skewed clocks"
    )
