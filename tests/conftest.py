"""Fixtures shared by every test package: one fast simulator per module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.sim import Sim, running_sim


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/soak/conftest.py: pytest reads options only from the
    # conftest files it loads before collecting.
    parser.addoption(
        "--soak-minutes",
        type=float,
        default=float(os.environ.get("PAYONCE_SOAK_MINUTES", "2")),
        help="how long the soak (tests/soak, marker soak) drives traffic; default 2,"
        " or PAYONCE_SOAK_MINUTES",
    )


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One fast simulator (``--latency fixed:0 --seed 7``) shared by a test module."""
    with running_sim(
        "--latency", "fixed:0", "--seed", "7", log_dir=tmp_path_factory.mktemp("sim")
    ) as sim:
        yield sim


@pytest.fixture
def fresh_sim(sim: Sim) -> Sim:
    """The shared simulator with an empty ledger."""
    sim.reset()
    return sim
