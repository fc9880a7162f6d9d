"""Fuzz tests: hypothesis with bounded examples, so the whole folder costs seconds.

``FUZZ`` is the budget of one property over pure functions; ``LIVE`` the budget
of one property whose examples each cross a socket to a real process. Neither
shrinks for long: a failing example is printed and becomes a regression test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support.processes import Process, start_payonce
from tests.support.sim import Sim, running_sim

FUZZ = settings(max_examples=100, deadline=None)
LIVE = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="package")
def fuzz_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One fast simulator for the whole fuzz folder."""
    with running_sim(
        "--latency",
        "fixed:0",
        "--token-rate",
        "0",
        "--seed",
        "7",
        log_dir=tmp_path_factory.mktemp("fuzz-sim"),
    ) as sim:
        yield sim


@pytest.fixture(scope="package")
def fuzz_gateway(fuzz_sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One gateway in front of it (SQLite store); its log must hold no traceback."""
    tmp = tmp_path_factory.mktemp("fuzz-gateway")
    process = start_payonce(
        ["serve", "--upstream", fuzz_sim.url, "--store", f"sqlite:///{tmp}/payonce.db"],
        log_dir=tmp,
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()
        assert "Traceback" not in process.output(), process.output()[-3000:]
