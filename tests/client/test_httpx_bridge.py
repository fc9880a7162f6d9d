"""The policy under a plain httpx client (``HttpxTransport``): the bridge to httpx2 and back.

openai 1.x and 2.x send through httpx; tests/client/test_sdk_versions.py runs
them. Here the transports themselves, in payonce's own environment (httpx is a
dev dependency), against a real gateway and simulator.
"""

from __future__ import annotations

import asyncio
import socket
import uuid

import httpx
import pytest

from payonce.client import (
    AsyncHttpxTransport,
    HttpxTransport,
    Outcome,
    RetryPolicy,
    attempt_history,
)
from tests.client.conftest import AUTH, CHAT_BODY, wait_for_billed
from tests.support.processes import Process
from tests.support.sim import Sim

SLOW = {"X-Sim-Delay-Ms": "1500"}
POLICY = RetryPolicy(attempts=3, deadline=20, read_timeout=0.5)


def test_a_timed_out_call_is_recovered_from_the_gateway_and_billed_once(
    gateway: Process, fresh_sim: Sim
) -> None:
    transport = HttpxTransport(httpx.HTTPTransport(), policy=POLICY, gateway=True)
    with httpx.Client(transport=transport) as client:
        answer = client.post(
            gateway.url + "/v1/chat/completions", json=CHAT_BODY, headers={**AUTH, **SLOW}
        )
    assert answer.status_code == 200
    assert answer.json()["choices"]
    history = attempt_history(answer)
    assert history and history[-1].outcome in (Outcome.RECOVERED, Outcome.SUCCESS)
    assert wait_for_billed(fresh_sim, 1)["billed"] == 1


def test_a_stream_comes_through_chunk_by_chunk(gateway: Process, fresh_sim: Sim) -> None:
    transport = HttpxTransport(httpx.HTTPTransport(), policy=POLICY, gateway=True)
    body = {**CHAT_BODY, "stream": True}
    with (
        httpx.Client(transport=transport) as client,
        client.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=AUTH) as s,
    ):
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert len(lines) > 2


def test_a_hopeless_call_raises_httpx_own_timeout() -> None:
    # Nothing answers on this port in time: a listener that never accepts.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(0)
        url = f"http://127.0.0.1:{holder.getsockname()[1]}/v1/chat/completions"
        policy = RetryPolicy(attempts=2, deadline=2, read_timeout=0.3, connect_timeout=0.3)
        transport = HttpxTransport(httpx.HTTPTransport(), policy=policy, gateway=False)
        with httpx.Client(transport=transport) as client, pytest.raises(httpx.TimeoutException):
            client.post(url, json=CHAT_BODY, headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())})


async def test_the_async_bridge(gateway: Process, fresh_sim: Sim) -> None:
    transport = AsyncHttpxTransport(httpx.AsyncHTTPTransport(), policy=POLICY, gateway=True)
    async with httpx.AsyncClient(transport=transport) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    gateway.url + "/v1/chat/completions", json=CHAT_BODY, headers={**AUTH, **SLOW}
                )
                for _ in range(3)
            )
        )
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert wait_for_billed(fresh_sim, 3)["billed"] == 3  # three calls, three keys
