"""Fixtures shared by every test package: one fast simulator per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.processes import start_payonce
from tests.support.sim import Sim


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One fast simulator (``--latency fixed:0 --seed 7``) shared by a test module."""
    process = start_payonce(
        ["sim", "--latency", "fixed:0", "--seed", "7"],
        log_dir=tmp_path_factory.mktemp("sim"),
        ready_path="/_sim/health",
    )
    try:
        yield Sim(process)
    finally:
        process.stop()


@pytest.fixture
def fresh_sim(sim: Sim) -> Sim:
    """The shared simulator with an empty ledger."""
    sim.reset()
    return sim
