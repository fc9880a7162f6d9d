"""``payonce demo`` end to end: real processes, the official SDK, the simulator's bill.

One demo run (five stacks, a few hundred business requests) is shared by the
module. Its figures are checked against the ledger, against ``payonce reconcile``
on the files it wrote, and against ``payonce simulate`` for the same stack.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from payonce.reconcile.run import reconcile

REQUESTS = 250
# The slower run's duplicate ratio is checked within three standard deviations of
# its own sample (_spread), so a smaller sample widens the bound, never breaks it.
SLOWER_REQUESTS = 80
KEYS = {
    "business_requests", "billed_generations", "duplicate_generations", "duplicate_ratio",
    "success_rate", "cost_usd",
}  # fmt: skip
DEMO_STACK = [
    "--latency", "lognormal:p50=4s,p99=30s", "--timeout", "10s", "--app-attempts", "2",
    "--app-backoff", "300ms", "--sdk-retries", "2", "--proxy-timeout", "8s",
    "--proxy-retries", "1", "--fail", "0.01", "--requests", "200000", "--seed", "3",
]  # fmt: skip


def _payonce(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payonce", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    folder = tmp_path_factory.mktemp("demo")
    summary = folder / "summary.json"
    done = _payonce(
        "demo", "--requests", str(REQUESTS), "--output", str(folder), "--json", str(summary)
    )
    assert done.returncode == 0, done.stderr
    return json.loads(summary.read_text()), folder, done.stdout


@pytest.mark.slow
def test_the_table_and_the_json_summary(demo: tuple[dict[str, Any], Path, str]) -> None:
    summary, _, output = demo
    assert set(summary["runs"]) == {"A", "B", "C", "D", "E"}
    for figures in summary["runs"].values():
        assert set(figures) >= KEYS
        assert figures["business_requests"] == REQUESTS
    assert "business requests through each stack" in output
    assert output.count("payonce reconcile --calls") == 5
    assert "last hop before the" in output


@pytest.mark.slow
def test_the_usual_stack_bills_duplicates_and_payonce_none(
    demo: tuple[dict[str, Any], Path, str],
) -> None:
    runs = demo[0]["runs"]
    assert runs["A"]["duplicate_ratio"] > 0.2, "the incident's 31%"
    assert runs["B"]["duplicate_generations"] == 0
    assert runs["B"]["billed_generations"] == REQUESTS  # faults are retried, never billed
    assert runs["C"]["duplicate_generations"] == 0
    assert runs["C"]["success_rate"] < runs["B"]["success_rate"], "the slow tail fails in C"
    assert runs["D"]["duplicate_generations"] > 0, "a retrying proxy below payonce bills again"
    assert runs["A"]["cost_usd"] > runs["B"]["cost_usd"]
    # Run A's stack, no key anywhere, payonce --dedupe-identical in front of the
    # provider (issue 31's figure: at most 1.01 billed per business request).
    assert runs["E"]["billed_generations"] <= REQUESTS * 1.01, runs["E"]


@pytest.mark.slow
def test_run_b_reconciles_exactly_with_its_ledger(demo: tuple[dict[str, Any], Path, str]) -> None:
    summary, folder, _ = demo
    run = folder / "run-B"
    with (run / "ledger.csv").open(newline="") as handle:
        bill = list(csv.DictReader(handle))
    report = reconcile([run / "calls.jsonl"], [run / "ledger.csv"])
    totals = report.totals
    assert totals.billed_generations == len(bill) == summary["runs"]["B"]["billed_generations"]
    assert totals.duplicate_generations == 0
    assert totals.unmatched_bill_lines == 0
    assert totals.business_requests == REQUESTS
    assert float(totals.total_cost_usd) == pytest.approx(summary["runs"]["B"]["cost_usd"])
    assert (run / "reconcile.html").read_text().lower().startswith("<!doctype html>")


@pytest.fixture(scope="module")
def slower_demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Runs A and D at half the incident's durations (about 45 s): a 5 s timeout.

    At the default --time-scale 0.1 a timeout lasts 1 s, and a loaded machine's
    delays (timers that fire late in the application's loop, a proxy slow to
    re-send) are a tenth of it: run A measured 0.241 against the model's 0.312
    with another suite and stress-ng alongside. Here they are a fiftieth.
    """
    folder = tmp_path_factory.mktemp("slower-demo")
    summary = folder / "summary.json"
    done = _payonce(
        "demo", "--requests", str(SLOWER_REQUESTS), "--runs", "A,D", "--time-scale", "0.5",
        "--output", str(folder), "--json", str(summary), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs: dict[str, Any] = json.loads(summary.read_text())["runs"]
    return runs


@pytest.mark.slow
def test_simulate_agrees_with_the_demo(slower_demo: dict[str, Any]) -> None:
    measured = slower_demo
    usual = _payonce("simulate", *DEMO_STACK, "--json")
    assert usual.returncode == 0, usual.stderr
    expected = json.loads(usual.stdout)["duplicate_ratio"]
    assert measured["A"]["duplicate_ratio"] == pytest.approx(expected, abs=_spread(measured["A"]))
    below = _payonce("simulate", *DEMO_STACK, "--payonce", "--proxy-below-payonce", "--json")
    expected = json.loads(below.stdout)["duplicate_ratio"]
    assert measured["D"]["duplicate_ratio"] == pytest.approx(expected, abs=_spread(measured["D"]))


def _spread(run: dict[str, Any]) -> float:
    """Three standard deviations of a duplicate ratio measured over one run's generations.

    The demo is one sample of a few hundred generations (a fixed 0.03 was about
    1.5 standard deviations); the model's figure is from 200,000.
    """
    p, n = run["duplicate_ratio"], max(1, run["billed_generations"])
    return 3 * (p * (1 - p) / n) ** 0.5 + 0.01


def test_lint_flags_the_demo_applications_unkeyed_path() -> None:
    application = Path(__file__).parents[2] / "src" / "payonce" / "demo" / "application.py"
    done = _payonce("lint", str(application), timeout=60)
    for code in ("PO101", "PO201", "PO202", "PO401"):
        assert code in done.stdout, done.stdout
    assert "use_key" in done.stdout, "the finding names the unkeyed path"
