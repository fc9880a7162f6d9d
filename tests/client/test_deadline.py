"""One overall deadline, on real sockets: a call ends at its deadline, not when the upstream does.

A 1.5 s deadline against a 5 s generation: a call that waited for the upstream,
or retried past its deadline, takes seconds longer. The calls may end up to 1 s
late here (a busy machine is slow to wake the caller: 100 ms was not enough
under pytest -n 8); never before the deadline. The exact arithmetic of waits
against the deadline is pinned on a manual clock in test_transport.py.
"""

from __future__ import annotations

import time

import httpx2
import pytest

from payonce.client import (
    AsyncIdempotentTransport,
    IdempotentTransport,
    RetryPolicy,
    SystemRetryClock,
)
from tests.client.conftest import AUTH, CHAT_BODY, post_chat
from tests.support.processes import Process
from tests.support.sim import Sim

DEADLINE = 1.5
SLACK = 1.0  # a stall bound: how late a busy machine may wake the caller
EARLY = 0.05  # a timer may fire this much early (it rounds to the millisecond)
POLICY = RetryPolicy(attempts=3, deadline=DEADLINE, read_timeout=60)
SLOW = {"X-Sim-Delay-Ms": "5000"}


@pytest.mark.parametrize("through_gateway", [False, True])
def test_sync_call_ends_by_its_deadline(sim: Sim, gateway: Process, through_gateway: bool) -> None:
    url = gateway.url if through_gateway else sim.url
    transport = IdempotentTransport(policy=POLICY, gateway=through_gateway, hooks=())
    with httpx2.Client(transport=transport) as http:
        started = time.monotonic()
        with pytest.raises(httpx2.ReadTimeout):
            post_chat(http, url, **SLOW)
        elapsed = time.monotonic() - started
    assert DEADLINE - EARLY < elapsed < DEADLINE + SLACK


async def test_async_call_ends_by_its_deadline(sim: Sim) -> None:
    transport = AsyncIdempotentTransport(policy=POLICY, hooks=())
    async with httpx2.AsyncClient(transport=transport) as http:
        started = time.monotonic()
        with pytest.raises(httpx2.ReadTimeout):
            await http.post(
                sim.url + "/v1/chat/completions", json=CHAT_BODY, headers={**AUTH, **SLOW}
            )
        elapsed = time.monotonic() - started
    assert DEADLINE - EARLY < elapsed < DEADLINE + SLACK


class _Sleeps(SystemRetryClock):
    """The real clock, noting each wait the transport asks for."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        super().sleep(seconds)


def test_retry_after_that_does_not_fit_ends_the_call_early(fresh_sim: Sim) -> None:
    # 503 + Retry-After: 1 from the simulator: the second wait would end past the
    # deadline, so the call ends then, after one wait, without waiting out the rest.
    clock = _Sleeps()
    transport = IdempotentTransport(policy=POLICY, hooks=(), clock=clock)
    with httpx2.Client(transport=transport) as http:
        started = time.monotonic()
        response = post_chat(http, fresh_sim.url, **{"X-Sim-Fail": "503"})
        elapsed = time.monotonic() - started
    assert response.status_code == 503
    assert fresh_sim.requests() == 2
    assert clock.slept == [1.0]
    assert 1.0 <= elapsed < DEADLINE + SLACK
