"""The soak's length: ``--soak-minutes`` (tests/conftest.py), and a timeout to match."""

from __future__ import annotations

import pytest


@pytest.fixture
def soak_minutes(request: pytest.FixtureRequest) -> float:
    return float(request.config.getoption("--soak-minutes"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The suite's 120 s default cannot hold a soak: its traffic plus three minutes
    # for starting, draining and checking.
    minutes = float(config.getoption("--soak-minutes"))
    for item in items:
        if item.get_closest_marker("soak") is not None:
            item.add_marker(pytest.mark.timeout(minutes * 60 + 180))
