"""A retry storm: the budget keeps 1,000 calls against a 50%-failing upstream near 1.1x.

Without a budget, three attempts per call would send about 1,750 requests here
(0.5 + 0.25 more per call); the token bucket stops retrying once more than
about 10% of recent calls needed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx2
import pytest
from prometheus_client import CollectorRegistry

from payonce.client import AsyncIdempotentTransport, PrometheusHook, RetryPolicy
from payonce.testing import zero_backoff
from tests.client.conftest import CHAT_BODY
from tests.support.sim import Sim, running_sim

CALLS = 1000
CONCURRENCY = 32


@pytest.fixture(scope="module")
def failing_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with running_sim(
        "--latency",
        "fixed:0",
        "--seed",
        "11",
        "--fail",
        "503:0.5",
        log_dir=tmp_path_factory.mktemp("failing-sim"),
    ) as sim:
        yield sim


async def test_a_storm_costs_at_most_one_tenth_more_plus_the_budget_floor(
    failing_sim: Sim,
) -> None:
    failing_sim.reset()
    registry = CollectorRegistry()
    policy = RetryPolicy(attempts=3)
    transport = AsyncIdempotentTransport(policy=policy, hooks=[PrometheusHook(registry)])
    assert transport.budget is not None
    floor = transport.budget.floor
    gate = asyncio.Semaphore(CONCURRENCY)
    statuses: list[int] = []

    async def call(http: httpx2.AsyncClient) -> None:
        async with gate:
            response = await http.post(failing_sim.url + "/v1/chat/completions", json=CHAT_BODY)
            statuses.append(response.status_code)

    with zero_backoff():
        async with httpx2.AsyncClient(transport=transport) as http:
            await asyncio.gather(*(call(http) for _ in range(CALLS)))

    sent = failing_sim.requests()
    assert len(statuses) == CALLS
    assert CALLS <= sent <= 1.1 * CALLS + floor
    assert set(statuses) == {200, 503}
    exhausted = registry.get_sample_value("payonce_client_budget_exhausted_total")
    assert exhausted is not None and exhausted > 0
    retries = registry.get_sample_value("payonce_client_retries_total", {"reason": "rejected"})
    assert retries == sent - CALLS
