"""Where the money goes: a scripted mix of scenarios and endpoints through the gateway,
checked in the call log and the metrics (issue 34)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from tests.gateway.conftest import AUTH, GatewayFactory, Sim
from tests.support.exposition import metric

NO_PACING = {"X-Sim-Token-Ms": "0"}
BODIES = {
    "/v1/chat/completions": {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "where does it go"}],
        "max_tokens": 20,
    },
    "/v1/completions": {"model": "gpt-3.5-turbo-instruct", "prompt": "where", "max_tokens": 20},
    "/v1/embeddings": {"model": "text-embedding-3-small", "input": "where"},
    "/v1/messages": {
        "model": "claude-sonnet-4-20250514",
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "where does it go"}],
    },
}
ENDPOINT = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
}

# (path, scenario header and value or None, key or None, extra headers)
SCRIPT: list[tuple[str, tuple[str, str] | None, str | None, dict[str, str]]] = [
    ("/v1/chat/completions", ("X-Payonce-Scenario", "invoice-summary"), "s-1", {}),
    ("/v1/chat/completions", ("X-Payonce-Scenario", "invoice-summary"), "s-1", {}),  # replay
    ("/v1/chat/completions", ("X-Payonce-Scenario", "invoice-summary"), "s-1", {}),  # replay
    ("/v1/messages", ("Helicone-Property-Feature", "support-bot"), "s-2", {}),
    ("/v1/messages", ("Helicone-Property-Feature", "support-bot"), "s-2", {}),  # replay
    ("/v1/embeddings", ("X-Payonce-Scenario", "search-index"), None, {}),  # not listed
    ("/v1/completions", None, None, {"x-stainless-retry-count": "1"}),  # unprotected retry
    ("/v1/chat/completions", ("X-Payonce-Scenario", "invoice-summary"), None,
     {"x-stainless-retry-count": "2"}),  # an unprotected retry of the listed scenario
]  # fmt: skip


def test_a_mix_of_scenarios_and_endpoints_is_logged_and_counted(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log_path = tmp_path / "calls.jsonl"
    gateway = start_gateway(
        "--call-log",
        str(log_path),
        "--no-match-sdk-retries",
        "--scenario-header",
        "Helicone-Property-Feature",
        "--scenarios",
        "invoice-summary,support-bot",
    )
    run = uuid.uuid4().hex[:8]
    for path, scenario, key, extra in SCRIPT:
        headers = {**AUTH, **NO_PACING, "x-api-key": "sk-x", **extra}
        if scenario is not None:
            headers[scenario[0]] = scenario[1]
        if key is not None:
            headers["Idempotency-Key"] = f"{key}-{run}"
        response = httpx.post(gateway.url + path, json=BODIES[path], headers=headers, timeout=30)
        assert response.status_code == 200, response.text
    text = httpx.get(gateway.url + "/_payonce/metrics").text

    def count(name: str, endpoint: str, scenario: str) -> float:
        return metric(text, name, endpoint=endpoint, scenario=scenario)

    assert count("payonce_scenario_requests_total", "chat", "invoice-summary") == 4
    assert count("payonce_scenario_requests_total", "messages", "support-bot") == 2
    assert count("payonce_scenario_requests_total", "embeddings", "other") == 1
    assert count("payonce_scenario_requests_total", "completions", "none") == 1
    assert count("payonce_scenario_duplicates_prevented_total", "chat", "invoice-summary") == 2
    assert count("payonce_scenario_duplicates_prevented_total", "messages", "support-bot") == 1
    assert count("payonce_scenario_unprotected_retries_total", "completions", "none") == 1
    assert count("payonce_scenario_unprotected_retries_total", "chat", "invoice-summary") == 1
    assert 'scenario="search-index"' not in text, "an unlisted scenario makes no series"
    ledger = fresh_sim.ledger()
    assert ledger["billed"] == 5
    by_scenario = sum(
        value
        for line in text.splitlines()
        if line.startswith("payonce_scenario_cost_usd_total{")
        for value in [float(line.rsplit(" ", 1)[1])]
    )
    assert by_scenario == pytest.approx(ledger["cost_usd"])
    assert count("payonce_scenario_cost_usd_total", "embeddings", "other") > 0

    gateway.stop()
    lines = [orjson.loads(line) for line in log_path.read_bytes().splitlines()]
    assert [(line["endpoint"], line["scenario"]) for line in lines] == [
        (ENDPOINT[path], scenario[1] if scenario else None) for path, scenario, _, _ in SCRIPT
    ]
    assert {line["scenario"] for line in lines} >= {"search-index"}, "the exact value is kept"
    forwarded = [line for line in lines if line["cost_usd"]]
    assert len(forwarded) == 5
    assert {line["price_source"] for line in forwarded} == {"genai-prices"}


def test_a_credential_names_the_scenario_of_its_requests_that_name_none(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    from payonce.gateway.keys import tenant_of_credential

    tenant = tenant_of_credential(AUTH["Authorization"].removeprefix("Bearer "))
    log_path = tmp_path / "calls.jsonl"
    gateway = start_gateway(
        "--call-log",
        str(log_path),
        "--credential-scenario",
        f"{tenant}=nightly-batch",
        "--scenarios",
        "nightly-batch",
    )
    path = "/v1/chat/completions"
    for extra in ({}, {"X-Payonce-Scenario": "invoice-summary"}):
        headers = {**AUTH, **NO_PACING, **extra}
        response = httpx.post(gateway.url + path, json=BODIES[path], headers=headers, timeout=30)
        assert response.status_code == 200
    text = httpx.get(gateway.url + "/_payonce/metrics").text
    assert (
        metric(text, "payonce_scenario_requests_total", endpoint="chat", scenario="nightly-batch")
        == 1
    )
    assert metric(text, "payonce_scenario_requests_total", endpoint="chat", scenario="other") == 1
    gateway.stop()
    lines = [orjson.loads(line) for line in log_path.read_bytes().splitlines()]
    assert [line["scenario"] for line in lines] == ["nightly-batch", "invoice-summary"]
