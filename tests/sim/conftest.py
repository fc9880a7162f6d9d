"""Real ``payonce sim`` processes for the integration tests, and a small client for them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.processes import Process, start_payonce
from tests.support.sim import CHAT_BODY, Sim

__all__ = ["CHAT_BODY", "Sim", "SimFactory"]

SimFactory = Callable[..., Sim]


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[SimFactory]:
    """Start simulators with the given flags; all are stopped after the test."""
    started: list[Process] = []

    def start(*flags: str) -> Sim:
        process = start_payonce(["sim", *flags], log_dir=tmp_path, ready_path="/_sim/health")
        started.append(process)
        return Sim(process)

    yield start
    for process in started:
        process.stop()
