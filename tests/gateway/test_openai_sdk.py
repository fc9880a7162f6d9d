"""The official openai SDK, retrying on its own, through the gateway: one bill per call.

The SDK mints one idempotency key per call and reuses it across its retries; it
only sends it when told which header to use (REFERENCE.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import httpx2 as httpx
import openai
import pytest

from tests.gateway.conftest import Sim
from tests.support.processes import Process
from tests.support.waiting import wait_until

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def sdk_client() -> Iterator[Callable[[str], openai.OpenAI]]:
    """Makes SDK clients, closed after the test: their pooled connections (one may be left
    by a timed-out attempt) are not left for the garbage collector to find in a later test."""
    clients: list[openai.OpenAI] = []

    def make(base_url: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", timeout=0.5)
        assert client.max_retries == 2, "the test relies on the SDK's default of three attempts"
        client._idempotency_header = "Idempotency-Key"
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def create(client: openai.OpenAI, delay_ms: int, key: str | None = None) -> object:
    headers = {"X-Sim-Delay-Ms": str(delay_ms)}
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=MESSAGES, max_tokens=20, extra_headers=headers
    )


def test_three_timed_out_attempts_bill_once_and_the_next_call_gets_the_stored_answer(
    gateway: Process, fresh_sim: Sim, sdk_client: Callable[[str], openai.OpenAI]
) -> None:
    client = sdk_client(gateway.url)
    key = f"order-{uuid.uuid4()}"
    with pytest.raises(openai.APITimeoutError):
        create(client, 4000, key)
    # The gateway kept the upstream call running after the client left, and stores it.
    status = httpx.get(
        f"{gateway.url}/_payonce/requests/{key}?wait=30",
        headers={"Authorization": "Bearer sk-test"},
        timeout=40,
    )
    assert status.json()["state"] == "completed", status.text
    ledger = fresh_sim.ledger()
    assert ledger["billed"] == 1
    assert ledger["requests"] == 1, "the SDK's retries joined the first call"
    # Reaching the upstream again would time out (4 s delay, 0.5 s timeout):
    # only a stored answer can come back.
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=20,
        extra_headers={"X-Sim-Delay-Ms": "4000", "Idempotency-Key": key},
    )
    assert raw.headers["idempotent-replayed"] == "true"
    assert raw.parse().choices[0].message.content
    assert fresh_sim.billed() == 1


def test_the_sdks_last_retry_receives_the_stored_completion(
    gateway: Process, fresh_sim: Sim, sdk_client: Callable[[str], openai.OpenAI]
) -> None:
    client = sdk_client(gateway.url)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=20,
        extra_headers={"X-Sim-Delay-Ms": "1500"},
    )
    assert raw.headers["idempotent-replayed"] == "true"
    assert int(raw.http_request.headers["x-stainless-retry-count"]) >= 1, "a retry got it"
    assert raw.parse().choices[0].message.content
    assert fresh_sim.billed() == 1


def test_the_same_calls_straight_to_the_simulator_bill_three_times(
    fresh_sim: Sim, sdk_client: Callable[[str], openai.OpenAI]
) -> None:
    client = sdk_client(fresh_sim.url)
    with pytest.raises(openai.APITimeoutError):
        create(client, 4000)
    # Each attempt's generation runs to its end and is billed, the last one about
    # 4 s after it began.
    wait_until(lambda: fresh_sim.billed() >= 3, "three bills")
    assert fresh_sim.billed() == fresh_sim.requests() == 3
    fresh_sim.reset()
    with pytest.raises(openai.APITimeoutError):
        create(client, 1500)  # every attempt times out: there is nothing to replay
    wait_until(lambda: fresh_sim.billed() >= 3, "three bills")
    assert fresh_sim.billed() == fresh_sim.requests() == 3
