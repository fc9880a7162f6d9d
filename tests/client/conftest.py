"""Client tests: the shared simulator, a gateway in front of it, and small helpers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from payonce.client import RetryDetails
from tests.support.processes import Process, start_payonce
from tests.support.sim import CHAT_BODY, Sim

__all__ = ["AUTH", "CHAT_BODY", "Recorder", "wait_for_billed"]

AUTH = {"Authorization": "Bearer sk-client-tests"}


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One payonce gateway (memory store) in front of the module's simulator.

    Every test uses fresh UUID keys, so tests sharing it cannot see each other's records.
    """
    process = start_payonce(
        ["serve", "--upstream", sim.url, "--store", "memory://"],
        log_dir=tmp_path_factory.mktemp("gateway"),
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()


class Recorder:
    """A RetryHook that keeps every RetryDetails it is given."""

    def __init__(self) -> None:
        self.details: list[RetryDetails] = []

    def __call__(self, details: RetryDetails) -> None:
        self.details.append(details)

    @property
    def outcomes(self) -> list[str]:
        return [d.outcome.value for d in self.details]

    @property
    def keys(self) -> set[str | None]:
        return {d.idempotency_key for d in self.details}


def wait_for_billed(sim: Sim, expected: int, timeout: float = 10.0) -> dict[str, Any]:
    """The ledger once ``expected`` generations are billed (the sim bills when it finishes)."""
    deadline = time.monotonic() + timeout
    ledger = sim.ledger()
    while ledger["billed"] < expected and time.monotonic() < deadline:
        time.sleep(0.05)
        ledger = sim.ledger()
    return ledger


def post_chat(client: httpx2.Client, url: str, **headers: str) -> httpx2.Response:
    return client.post(url + "/v1/chat/completions", json=CHAT_BODY, headers={**AUTH, **headers})
