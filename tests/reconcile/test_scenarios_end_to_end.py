"""``payonce reconcile`` by scenario and by endpoint by default, on a call log written by a
real gateway in front of a real simulator, and the costs the provider stated (issue 34).

The gateway's call log names each request's scenario and endpoint; reconcile reads
them as its tag and endpoint without being told (``--calls-map`` still wins), says
which column it used, and compares the calls priced by the provider's own cost
(the simulator's openrouter profile states ``usage.cost``) with their list price.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from tests.support.processes import start_payonce
from tests.support.sim import running_sim

AUTH = {"Authorization": "Bearer sk-test-tenant-a", "x-api-key": "sk-x", "X-Sim-Token-Ms": "0"}
CHAT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "where does it go"}],
    "max_tokens": 20,
}
MESSAGE = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "where does it go"}],
}
# gpt-4o-mini listed at twice what the simulator bills: stated and list prices differ.
PRICES = '[models."gpt-4o-mini"]\ninput = 0.30\noutput = 1.20\n'


def reconcile(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "payonce", "reconcile", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(json.loads(out.read_text()))


@pytest.mark.slow
def test_reconcile_reports_by_scenario_and_endpoint_from_a_gateway_call_log(
    tmp_path: Path,
) -> None:
    ledger, log = tmp_path / "ledger.csv", tmp_path / "calls.jsonl"
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    run = uuid.uuid4().hex[:8]
    sim_flags = ("--latency", "fixed:0", "--seed", "7", "--ledger", str(ledger))
    with running_sim(*sim_flags, log_dir=tmp_path) as sim:
        gateway = start_payonce(
            ["serve", "--upstream", sim.url, "--store", f"sqlite:///{tmp_path}/payonce.db",
             "--call-log", str(log), "--prices", str(prices), "--no-match-sdk-retries"],
            log_dir=tmp_path,
            ready_path="/_payonce/health",
        )  # fmt: skip
        try:

            def post(path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
                response = httpx.post(
                    gateway.url + path, json=body, headers={**AUTH, **headers}, timeout=30
                )
                assert response.status_code == 200, response.text
                return response

            invoice = {"X-Payonce-Scenario": "invoice-summary", "X-Sim-Wire": "openrouter"}
            for n in range(2):  # two orders, each sent twice: the second is a replay
                for _ in range(2):
                    post(
                        "/v1/chat/completions", CHAT, **invoice, **{"Idempotency-Key": f"i{n}{run}"}
                    )
            # The answer of the first order fetched again: the gateway's own path.
            fetched = httpx.get(
                f"{gateway.url}/_payonce/requests/i0{run}/response", headers=AUTH, timeout=30
            )
            assert fetched.status_code == 200, fetched.text
            support = {"X-Payonce-Scenario": "support-bot"}
            post("/v1/messages", MESSAGE, **support, **{"Idempotency-Key": f"s{run}"})
            # Retries without a key: each one billed again.
            post("/v1/messages", MESSAGE, **support, **{"x-stainless-retry-count": "0"})
            post("/v1/messages", MESSAGE, **support, **{"x-stainless-retry-count": "1"})
        finally:
            gateway.stop()  # flushes the call log
        summary = sim.ledger()  # and this flushes the ledger's CSV export
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert [line["endpoint"] for line in lines if line["path"].startswith("/_payonce/")] == [None]
    assert summary["billed"] == 5

    document = reconcile(tmp_path, "--calls", str(log), "--bill", str(ledger))
    assert document["tag_column"] == "scenario" and document["endpoint_column"] == "endpoint"
    by_tag, by_endpoint = document["by_tag"], document["by_endpoint"]
    assert set(by_tag) == {"invoice-summary", "support-bot"}
    assert by_tag["invoice-summary"]["billed_generations"] == 2
    assert by_tag["invoice-summary"]["business_requests"] == 2
    assert by_tag["invoice-summary"]["duplicate_generations"] == 0
    assert by_tag["support-bot"]["billed_generations"] == 3
    assert by_tag["support-bot"]["duplicate_generations"] == 1
    # The fetch names no endpoint: its business request's endpoint is its other calls'.
    assert set(by_endpoint) == {"chat", "messages"}
    assert by_endpoint["chat"]["billed_generations"] == 2
    assert by_endpoint["messages"]["billed_generations"] == 3
    # The two invoice calls priced by the cost they stated, beside their list price.
    stated = document["stated_costs"]
    billed = sum(
        entry["cost_usd"] for entry in summary["entries"] if entry["model"] == "gpt-4o-mini"
    )
    assert stated["calls"] == stated["calls_with_list_price"] == 2
    assert stated["stated_cost_usd"] == pytest.approx(billed, abs=1e-8)
    assert stated["list_cost_usd"] == pytest.approx(2 * billed, rel=1e-3)
    assert stated["difference_usd"] == pytest.approx(-billed, rel=1e-3)

    # An explicit --calls-map wins, and the JSON says which column was read.
    mapped = reconcile(
        tmp_path, "--calls", str(log), "--bill", str(ledger), "--calls-map", "tag=tenant",
        "--html", str(tmp_path / "report.html"),
    )  # fmt: skip
    assert mapped["tag_column"] == "tenant" and mapped["endpoint_column"] == "endpoint"
    assert len(mapped["by_tag"]) == 1 and "invoice-summary" not in mapped["by_tag"]
    page = (tmp_path / "report.html").read_text()
    assert "Stated costs" in page and "By endpoint" in page
