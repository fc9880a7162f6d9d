"""The official anthropic SDK through the gateway: its retries become replays."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anthropic
import pytest

from tests.gateway.conftest import Sim
from tests.support.processes import Process
from tests.support.waiting import wait_until


@pytest.fixture
def sdk_client() -> Iterator[Callable[[str], anthropic.Anthropic]]:
    """Makes SDK clients, closed after the test (no pooled socket left to a later test's GC)."""
    clients: list[anthropic.Anthropic] = []

    def make(base_url: str) -> anthropic.Anthropic:
        clients.append(anthropic.Anthropic(base_url=base_url, api_key="sk-ant-test", timeout=0.5))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def test_anthropic_retries_bill_once(
    gateway: Process, fresh_sim: Sim, sdk_client: Callable[[str], anthropic.Anthropic]
) -> None:
    client = sdk_client(gateway.url)
    client._idempotency_header = "Idempotency-Key"
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-20250514",
        max_tokens=32,
        messages=[{"role": "user", "content": "Name a colour."}],
        extra_headers={"X-Sim-Delay-Ms": "1500"},
    )
    message = raw.parse()
    assert raw.headers["idempotent-replayed"] == "true"
    assert message.content[0].text
    assert message.usage.output_tokens > 0
    assert fresh_sim.billed() == 1


def test_anthropic_without_the_gateway_bills_every_attempt(
    fresh_sim: Sim, sdk_client: Callable[[str], anthropic.Anthropic]
) -> None:
    client = sdk_client(fresh_sim.url)
    with pytest.raises(anthropic.APITimeoutError):
        client.messages.create(
            model="claude-sonnet-4-20250514",
            max_tokens=32,
            messages=[{"role": "user", "content": "Name a colour."}],
            extra_headers={"X-Sim-Delay-Ms": "1500"},
        )
    # Each attempt's generation runs to its end and is billed.
    wait_until(lambda: fresh_sim.billed() >= 3, "three bills")
    assert fresh_sim.billed() == fresh_sim.requests() == 3
