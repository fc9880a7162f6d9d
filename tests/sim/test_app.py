"""The application in process, on an injected clock: timestamps and routing details."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from payonce.clock import ManualClock
from payonce.sim import build_app
from payonce.sim.app import LEDGER
from payonce.sim.config import SimConfig
from payonce.sim.faults import FaultPlan
from payonce.sim.latency import FixedLatency

Client = TestClient[web.Request, web.Application]

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello there friend"}]}


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    app = build_app(SimConfig(latency=FixedLatency(0.0)), clock=ManualClock(1_700_000_000.0))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_clock_stamps_created_and_finished_at(client: Client) -> None:
    response = await client.post("/v1/chat/completions", json=CHAT)
    body = await response.json()
    assert body["created"] == 1_700_000_000
    ledger = await (await client.get("/_sim/ledger")).json()
    assert ledger["entries"][0]["finished_at"] == "2023-11-14T22:13:20.000Z"


async def test_ledger_is_reachable_in_process(client: Client) -> None:
    await client.post("/v1/messages", json={**CHAT, "max_tokens": 5})
    ledger = client.app[LEDGER]
    assert (ledger.requests, ledger.billed) == (1, 1)
    assert ledger.entries[0].output_tokens == 5


async def test_seeded_failures_in_process() -> None:
    config = SimConfig(latency=FixedLatency(0.0), failures=FaultPlan(((500, 0.5),)), seed=3)
    runs = []
    for _ in range(2):
        async with TestClient(TestServer(build_app(config))) as client:
            statuses = []
            for _ in range(30):
                response = await client.post("/v1/chat/completions", json=CHAT)
                statuses.append(response.status)
            runs.append(statuses)
    assert runs[0] == runs[1]
    assert set(runs[0]) == {200, 500}


async def test_clock_stamps_stream_chunks(client: Client) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={"X-Sim-Token-Ms": "0"},
    )
    assert response.content_type == "text/event-stream"
    events = (await response.read()).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(event.removeprefix(b"data: ")) for event in events[:-2]]
    assert {chunk["created"] for chunk in chunks} == {1_700_000_000}
    ledger = await (await client.get("/_sim/ledger")).json()
    assert ledger["entries"][0]["finished_at"] == "2023-11-14T22:13:20.000Z"


async def test_seeded_stream_deaths_in_process() -> None:
    config = SimConfig(latency=FixedLatency(0.0), token_interval=0.0, die_mid_stream=0.5, seed=4)
    runs = []
    for _ in range(2):
        async with TestClient(TestServer(build_app(config))) as client:
            lengths = []
            for _ in range(20):
                response = await client.post(
                    "/v1/messages", json={**CHAT, "max_tokens": 5, "stream": True}
                )
                try:
                    lengths.append(len(await response.read()))
                except aiohttp.ClientPayloadError:
                    lengths.append(-1)  # died: the body was cut short
            runs.append(lengths)
            assert client.app[LEDGER].billed == sum(length > 0 for length in lengths)
    assert runs[0] == runs[1]
    assert -1 in runs[0]
    assert any(length > 0 for length in runs[0])


async def test_clock_stamps_responses_created_and_completed(client: Client) -> None:
    body = {"model": "gpt-4o", "input": "hello there friend"}
    created = await (await client.post("/v1/responses", json=body)).json()
    assert created["created_at"] == created["completed_at"] == 1_700_000_000
    stream = await client.post(
        "/v1/responses", json={**body, "stream": True}, headers={"X-Sim-Token-Ms": "0"}
    )
    last = (await stream.read()).split(b"\n\n")[-2]
    assert last.startswith(b"event: response.completed\ndata: ")
    completed = json.loads(last.split(b"data: ", 1)[1])["response"]
    assert (completed["created_at"], completed["completed_at"]) == (1_700_000_000,) * 2


async def test_background_generations_still_running_stop_with_the_app() -> None:
    app = build_app(SimConfig(latency=FixedLatency(0.0)))
    async with TestClient(TestServer(app)) as client:
        response = await client.post(
            "/v1/responses",
            json={"model": "gpt-4o", "input": "hi", "background": True},
            headers={"X-Sim-Delay-Ms": "60000"},
        )
        assert (await response.json())["status"] == "queued"
        assert client.app[LEDGER].generating == 1
    assert app[LEDGER].generating == 0
    assert app[LEDGER].billed == 0
