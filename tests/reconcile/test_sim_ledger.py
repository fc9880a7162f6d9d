"""Against a real simulator: retries sent straight to it are billed twice, and reconcile says so.

The client here keeps its own call log in the generic CSV schema (its order id and
the provider request id the simulator answered with), as an application without the
gateway would. The bill is the simulator's own ``--ledger`` CSV export.
"""

from __future__ import annotations

import csv
from decimal import Decimal
from pathlib import Path

import httpx2 as httpx
import pytest

from payonce.reconcile.run import reconcile
from tests.support.processes import running

BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "summarise ticket"}]}


@pytest.mark.slow
def test_duplicates_billed_by_the_simulator_are_found(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.csv"
    calls = tmp_path / "calls.csv"
    args = ["sim", "--latency", "fixed:0", "--seed", "7", "--ledger", str(ledger)]
    with running(args, log_dir=tmp_path, ready_path="/_sim/health") as sim:
        rows = []
        # Five orders; orders 1 and 3 are retried once (the first answer "timed out").
        for order, attempts in [(0, 1), (1, 2), (2, 1), (3, 2), (4, 1)]:
            for _ in range(attempts):
                response = httpx.post(sim.url + "/v1/chat/completions", json=BODY, timeout=10)
                assert response.status_code == 200
                rows.append([f"order-{order}", response.headers["x-request-id"], 200])
        # Reading the ledger flushes the CSV export.
        summary = httpx.get(sim.url + "/_sim/ledger", timeout=10).json()
    with calls.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["business_id", "provider_request_id", "status"])
        writer.writerows(rows)

    report = reconcile([calls], [ledger])
    totals = report.totals
    assert [source.format for source in report.inputs] == ["generic", "ledger"]
    assert totals.billed_generations == summary["billed"] == 7
    assert totals.duplicate_generations == 2
    assert totals.business_requests == totals.successful_business_requests == 5
    assert totals.unmatched_bill_lines == 0
    assert float(totals.total_cost_usd) == pytest.approx(summary["cost_usd"], abs=1e-9)
    # Same prompt, same price: each duplicate cost what one generation costs.
    one = Decimal(str(summary["entries"][0]["cost_usd"]))
    assert float(totals.wasted_cost_usd) == pytest.approx(float(2 * one), abs=1e-9)
    assert [s.key for s in report.by_model] == ["gpt-4o-mini"]
    assert report.malformed_rows == 0
