"""End to end: traffic through a real gateway, calls around it, and the simulator's usage reports.

Tenant A sends 5 keyed business requests, each twice (the second is a replay);
tenant B sends 3 unkeyed calls, each followed by the SDK's retry without a key.
Around the gateway, 2 calls go straight to the simulator with A's key and 1 with a
key the gateway never sees. The usage report the simulator serves must then show
exactly: 14 billed requests, 11 logged upstream calls, 3 duplicates (B's retries)
and 3 unexplained requests (2 on A's key, 1 on the other), at their real cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from payonce.sim.ledger import credential_ids
from tests.support.processes import Process, start_payonce
from tests.support.sim import Sim

KEY_A, KEY_B, KEY_C = "sk-test-tenant-alpha", "sk-test-tenant-bravo", "sk-test-other-app"
ADMIN = {"Authorization": "Bearer sk-admin-test-reconcile"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello"}]}


def post(url: str, credential: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = httpx.post(
        url + "/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {credential}", **(headers or {})},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def tenant_id(credential: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "payonce", "tenant-id"],
        input=credential,
        capture_output=True,
        text=True,
        check=True,
    )
    assert credential not in result.stdout + result.stderr
    return result.stdout.strip()


def report_pages(sim: Sim, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    while True:
        response = httpx.get(sim.url + path, params=params, headers=ADMIN, timeout=10)
        response.raise_for_status()
        pages.append(response.json())
        if not pages[-1]["has_more"]:
            return pages
        params = {**params, "page": pages[-1]["next_page"]}


@pytest.fixture
def traffic(fresh_sim: Sim, tmp_path: Path) -> dict[str, Any]:
    log = tmp_path / "calls.jsonl"
    gateway: Process = start_payonce(
        [
            "serve",
            "--upstream",
            fresh_sim.url,
            "--store",
            f"sqlite:///{tmp_path}/payonce.db",
            "--call-log",
            str(log),
            # B's retries are the kind no gateway prevents: not matched to a first
            # attempt (docs/gateway.md, "SDK retries without a key").
            "--no-match-sdk-retries",
        ],
        log_dir=tmp_path,
        ready_path="/_payonce/health",
    )
    start = int(time.time()) - 600  # ten minutes of 1-minute buckets: several pages
    try:
        for n in range(5):
            first = post(gateway.url, KEY_A, {"Idempotency-Key": f"order-{n}"})
            again = post(gateway.url, KEY_A, {"Idempotency-Key": f"order-{n}"})
            assert again["id"] == first["id"]
        for _ in range(3):
            post(gateway.url, KEY_B)
            post(gateway.url, KEY_B, {"x-stainless-retry-count": "1"})
    finally:
        gateway.stop()  # flushes the call log
    bypass = [post(fresh_sim.url, KEY_A), post(fresh_sim.url, KEY_A), post(fresh_sim.url, KEY_C)]
    return {"sim": fresh_sim, "log": log, "start": start, "bypass": bypass}


def reconcile(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "payonce", "reconcile", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    document = json.loads(out.read_text()) if out.exists() else {}
    return result.returncode, document, result.stdout + result.stderr


def test_usage_report_from_the_simulator(traffic: dict[str, Any], tmp_path: Path) -> None:
    sim: Sim = traffic["sim"]
    pages = report_pages(
        sim,
        "/v1/organization/usage/completions",
        {
            "start_time": traffic["start"],
            "bucket_width": "1m",
            "group_by": ["model", "api_key_id"],
            "limit": 3,  # several pages, as a long range would need
        },
    )
    assert len(pages) > 1
    usage = tmp_path / "usage.jsonl"
    usage.write_text("".join(json.dumps(page) + "\n" for page in pages))
    costs = tmp_path / "costs.json"
    costs.write_text(
        json.dumps(
            report_pages(
                sim,
                "/v1/organization/costs",
                {"start_time": traffic["start"], "group_by": ["line_item"]},
            )
        )
    )
    key_map = tmp_path / "keys.json"
    key_a, key_b = (
        credential_ids(KEY_A, anthropic=False)[0],
        credential_ids(KEY_B, anthropic=False)[0],
    )
    key_map.write_text(json.dumps({tenant_id(KEY_A): key_a, tenant_id(KEY_B): key_b}))

    code, document, output = reconcile(
        tmp_path, "--calls", str(traffic["log"]), "--bill", str(usage), "--key-map", str(key_map)
    )
    assert code == 0, output
    assert document["billed_requests"] == 14
    assert document["logged_upstream_calls"] == 11
    assert document["business_requests"] == 8  # 5 keys of A, 3 unkeyed calls of B
    assert document["duplicate_requests"] == 3
    assert document["unexplained_requests"] == 3
    assert document["unbilled_calls"] == 0
    assert document["duplicate_ratio"] == pytest.approx(3 / 14)
    by_key = document["by_key"]
    assert by_key[key_a]["unexplained_requests"] == 2
    assert by_key[key_b]["unexplained_requests"] == 0
    assert by_key[key_b]["duplicate_requests"] == 3
    assert by_key["(keys not in --key-map)"]["unexplained_requests"] == 1
    # The bypassing calls' real cost, from the simulator's own ledger.
    ledger = {entry["provider_request_id"]: entry for entry in sim.ledger()["entries"]}
    bypass_cost = sum(Decimal(str(ledger[call["id"]]["cost_usd"])) for call in traffic["bypass"])
    bypass_tokens = sum(
        ledger[call["id"]]["input_tokens"] + ledger[call["id"]]["output_tokens"]
        for call in traffic["bypass"]
    )
    assert document["unexplained_tokens"] == bypass_tokens
    assert document["unexplained_cost_usd"] == pytest.approx(float(bypass_cost), abs=1e-9)
    retries = [e for e in ledger.values() if e["api_key_id"] == key_b]
    assert document["wasted_cost_usd"] == pytest.approx(
        float(sum(Decimal(str(e["cost_usd"])) for e in retries)) / 2, abs=1e-9
    )
    assert "Unexplained requests" in output

    # With the cost report, the money comes from it; an alert exits 3.
    code, document, output = reconcile(
        tmp_path,
        "--calls",
        str(traffic["log"]),
        "--bill",
        str(usage),
        str(costs),
        "--max-unexplained-cost",
        "0",
        "--html",
        str(tmp_path / "report.html"),
    )
    assert code == 3, output
    assert document["unexplained_cost_basis"] == "cost report"
    assert document["unexplained_cost_usd"] == pytest.approx(float(bypass_cost), abs=1e-9)
    assert document["alerts"][0]["flag"] == "--max-unexplained-cost"
    html = (tmp_path / "report.html").read_text()
    assert "Billed against logged" in html and "<polyline" in html
    for secret in (KEY_A, KEY_B, KEY_C):
        assert secret not in output and secret not in json.dumps(document) and secret not in html


def test_fetch_openai_from_the_simulator(traffic: dict[str, Any], tmp_path: Path) -> None:
    """``--fetch openai`` pulls the same reports itself, and the admin key stays secret."""
    sim: Sim = traffic["sim"]
    admin_key = ADMIN["Authorization"].removeprefix("Bearer ")
    key_map = tmp_path / "keys.json"
    key_a = credential_ids(KEY_A, anthropic=False)[0]
    key_b = credential_ids(KEY_B, anthropic=False)[0]
    key_map.write_text(json.dumps({tenant_id(KEY_A): key_a, tenant_id(KEY_B): key_b}))
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(traffic["start"]))
    out = tmp_path / "out.json"
    saved = tmp_path / "saved"
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_ADMIN_KEY")}
    result = subprocess.run(
        [
            sys.executable, "-m", "payonce", "reconcile", "--calls", str(traffic["log"]),
            "--fetch", "openai", "--since", since, "--fetch-url", sim.url,
            "--bucket-width", "1m", "--save", str(saved), "--key-map", str(key_map),
            "--json", str(out), "--max-duplicate-ratio", "0.5",
        ],
        env={**environment, "OPENAI_ADMIN_KEY": admin_key},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert (document["billed_requests"], document["logged_upstream_calls"]) == (14, 11)
    assert (document["duplicate_requests"], document["unexplained_requests"]) == (3, 3)
    assert document["by_key"][key_a]["unexplained_requests"] == 2
    assert document["unexplained_cost_basis"] == "cost report"
    ledger = {entry["provider_request_id"]: entry for entry in sim.ledger()["entries"]}
    bypass_cost = sum(Decimal(str(ledger[call["id"]]["cost_usd"])) for call in traffic["bypass"])
    assert document["unexplained_cost_usd"] == pytest.approx(float(bypass_cost), abs=1e-9)
    everything = result.stdout + result.stderr + out.read_text()
    everything += "".join(path.read_text() for path in saved.iterdir())
    assert admin_key not in everything
    for secret in (KEY_A, KEY_B, KEY_C):
        assert secret not in everything
