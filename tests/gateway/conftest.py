"""Real processes for gateway tests: one ``payonce sim`` per module, gateways per test
(or per module, with :func:`module_gateway`, where the tests share no state but their keys)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.support.processes import Process, start_payonce
from tests.support.sim import Sim

__all__ = ["AUTH", "CHAT", "GatewayFactory", "Sim", "chat"]


GatewayFactory = Callable[..., Process]


@pytest.fixture
def start_gateway(fresh_sim: Sim, tmp_path: Path) -> Iterator[GatewayFactory]:
    """Start gateways in front of the sim; each call may pass extra ``serve`` flags."""
    started: list[Process] = []

    def start(
        *flags: str,
        store: str | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> Process:
        args = [
            "serve",
            "--upstream",
            fresh_sim.url,
            "--store",
            store or f"sqlite:///{tmp_path}/payonce.db",
        ]
        process = start_payonce(
            [*args, *flags], log_dir=tmp_path, ready_path="/_payonce/health", port=port, env=env
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def module_gateway(
    sim: Sim, tmp_path_factory: pytest.TempPathFactory, *flags: str
) -> Iterator[Process]:
    """A gateway in front of the module's sim, for a module-scoped fixture to yield.

    For tests that read only what their own keys did (each test its own key) and
    the simulator's ledger (``fresh_sim`` empties it before each), and that leave
    nothing running when they return: starting and stopping a gateway costs
    1.5-3 s of a busy machine's time, more than most such tests take.
    """
    folder = tmp_path_factory.mktemp("gateway")
    args = ["serve", "--upstream", sim.url, "--store", f"sqlite:///{folder}/payonce.db"]
    process = start_payonce([*args, *flags], log_dir=folder, ready_path="/_payonce/health")
    yield process
    process.stop()


@pytest.fixture
def gateway(start_gateway: GatewayFactory) -> Process:
    return start_gateway()


CHAT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Say hello"}],
    "max_tokens": 16,
}
AUTH = {"Authorization": "Bearer sk-test-tenant-a"}


def chat(
    url: str,
    key: str | None = None,
    *,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> httpx.Response:
    """POST a chat completion through ``url`` with an optional key."""
    sent = {**AUTH, **(headers or {})}
    if key is not None:
        sent["Idempotency-Key"] = key
    return httpx.post(
        url + "/v1/chat/completions", json=body or CHAT, headers=sent, timeout=timeout
    )
