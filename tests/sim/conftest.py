"""Real ``payonce sim`` processes for the integration tests, and a small client for them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.support.processes import Process, start_payonce

CHAT_BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello there friend"}]}


class Sim:
    """A running simulator: its URL, its ledger, and its log."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.url = process.url

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 10)
        return httpx.post(self.url + path, json=body, **kwargs)

    def chat(self, **kwargs: Any) -> httpx.Response:
        return self.post("/v1/chat/completions", CHAT_BODY, **kwargs)

    def ledger(self) -> dict[str, Any]:
        response = httpx.get(self.url + "/_sim/ledger", timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def reset(self) -> None:
        httpx.delete(self.url + "/_sim/ledger", timeout=10).raise_for_status()


SimFactory = Callable[..., Sim]


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
