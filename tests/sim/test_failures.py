"""Injected failures: forced per request or drawn from a seeded --fail plan; never billed."""

from __future__ import annotations

from collections import Counter

import httpx2 as httpx
import pytest

from tests.sim.conftest import CHAT_BODY, Sim, SimFactory

ANTHROPIC_BODY = {
    "model": "claude-sonnet-4-0",
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.mark.parametrize("status", [400, 429, 500, 503, 529, 599])
def test_x_sim_fail_forces_the_status_before_work(fresh_sim: Sim, status: int) -> None:
    response = fresh_sim.chat(headers={"X-Sim-Fail": str(status)})
    assert response.status_code == status
    assert response.json()["error"]["message"]
    assert response.headers["x-request-id"].startswith("chatcmpl-")
    if status in (429, 503, 529):
        assert response.headers["retry-after"] == "1"
    else:
        assert "retry-after" not in response.headers
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 0)


def test_x_sim_fail_on_anthropic_uses_its_error_shape(fresh_sim: Sim) -> None:
    response = fresh_sim.post("/v1/messages", ANTHROPIC_BODY, headers={"X-Sim-Fail": "529"})
    assert response.status_code == 529
    assert response.json()["error"]["type"] == "overloaded_error"
    assert response.headers["retry-after"] == "1"


def test_x_sim_fail_comes_before_body_validation(fresh_sim: Sim) -> None:
    response = httpx.post(
        fresh_sim.url + "/v1/chat/completions",
        content=b"garbage",
        headers={"X-Sim-Fail": "503"},
        timeout=10,
    )
    assert response.status_code == 503


def statuses(sim: Sim, count: int) -> list[int]:
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        return [
            client.post("/v1/chat/completions", json=CHAT_BODY).status_code for _ in range(count)
        ]


def test_fail_rates_are_honoured_and_failures_are_not_billed(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:0", "--seed", "42", "--fail", "500:0.2,429:0.1")
    seen = statuses(sim, 400)
    counts = Counter(seen)
    assert set(counts) == {200, 429, 500}
    # Binomial(400, p): the bounds are more than four standard deviations wide.
    assert 48 <= counts[500] <= 112
    assert 16 <= counts[429] <= 64
    ledger = sim.ledger()
    assert ledger["requests"] == 400
    assert ledger["billed"] == counts[200]


def test_the_same_seed_fails_the_same_requests(start_sim: SimFactory) -> None:
    flags = ("--latency", "fixed:0", "--fail", "500:0.3,503:0.1")
    first = statuses(start_sim(*flags, "--seed", "9"), 80)
    again = statuses(start_sim(*flags, "--seed", "9"), 80)
    other = statuses(start_sim(*flags, "--seed", "10"), 80)
    assert first == again
    assert first != other


def test_drop_after_compute_rate_bills_every_generation(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:0", "--seed", "5", "--drop-after-compute", "0.5")
    answered = dropped = 0
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        for _ in range(60):
            try:
                response = client.post("/v1/chat/completions", json=CHAT_BODY)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                dropped += 1
            else:
                assert response.status_code == 200
                answered += 1
    assert 12 <= dropped <= 48
    ledger = sim.ledger()
    assert ledger["billed"] == ledger["requests"] == 60
    assert all(entry["client_connected"] for entry in ledger["entries"])
    assert "Traceback" not in sim.process.output()
