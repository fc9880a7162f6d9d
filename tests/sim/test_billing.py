"""Billing as a provider bills: every finished generation, whether or not the client is there."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from payonce.sim.ledger import CSV_FIELDS
from tests.sim.conftest import Sim, SimFactory


def wait_for_billed(sim: Sim, count: int, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        ledger = sim.ledger()
        if ledger["billed"] >= count or time.monotonic() > deadline:
            return ledger
        time.sleep(0.05)


def test_a_client_that_times_out_is_billed_anyway(fresh_sim: Sim) -> None:
    with pytest.raises(httpx.ReadTimeout):
        fresh_sim.chat(headers={"X-Sim-Delay-Ms": "1000"}, timeout=0.3)
    assert fresh_sim.ledger()["billed"] == 0, "billed before the generation finished"
    ledger = wait_for_billed(fresh_sim, 1)
    assert ledger["billed"] == 1
    assert ledger["requests"] == 1
    assert ledger["entries"][0]["client_connected"] is False


def test_a_client_that_waits_is_billed_as_connected(fresh_sim: Sim) -> None:
    started = time.monotonic()
    response = fresh_sim.chat(headers={"X-Sim-Delay-Ms": "300"})
    assert time.monotonic() - started >= 0.29  # the generation took the asked-for time
    assert response.status_code == 200
    [entry] = fresh_sim.ledger()["entries"]
    assert entry["client_connected"] is True


def test_drop_bills_then_closes_without_a_response(fresh_sim: Sim) -> None:
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        fresh_sim.chat(headers={"X-Sim-Drop": "1"})
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)
    assert ledger["entries"][0]["client_connected"] is True
    assert fresh_sim.chat().status_code == 200, "the sim keeps serving after a drop"
    log = fresh_sim.process.output()
    assert "Traceback" not in log
    assert "Error handling request" not in log


def test_drop_header_zero_overrides_the_drop_rate(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:0", "--drop-after-compute", "1")
    assert sim.chat(headers={"X-Sim-Drop": "0"}).status_code == 200
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        sim.chat()


def test_fixed_latency_flag(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:300ms")
    started = time.monotonic()
    assert sim.chat().status_code == 200
    assert time.monotonic() - started >= 0.29


def test_reset(fresh_sim: Sim) -> None:
    fresh_sim.chat()
    fresh_sim.chat(headers={"X-Sim-Fail": "500"})
    before = fresh_sim.ledger()
    assert (before["requests"], before["billed"]) == (2, 1)
    assert before["cost_usd"] > 0
    response = httpx.delete(fresh_sim.url + "/_sim/ledger", timeout=10)
    assert response.json() == {
        "billed": 0,
        "cost_usd": 0.0,
        "requests": 0,
        "generating": 0,
        "entries": [],
    }
    assert fresh_sim.ledger() == {
        "billed": 0,
        "cost_usd": 0.0,
        "requests": 0,
        "generating": 0,
        "entries": [],
    }
    fresh_sim.chat()
    assert fresh_sim.ledger()["requests"] == 1


def test_ledger_summary_without_entries(fresh_sim: Sim) -> None:
    fresh_sim.chat()
    summary = httpx.get(fresh_sim.url + "/_sim/ledger?entries=0", timeout=10).json()
    assert (summary["billed"], summary["entries"]) == (1, [])


def test_cost_adds_up(fresh_sim: Sim) -> None:
    for _ in range(3):
        fresh_sim.chat()
    ledger = fresh_sim.ledger()
    assert ledger["cost_usd"] == pytest.approx(sum(e["cost_usd"] for e in ledger["entries"]))
    assert ledger["cost_usd"] == pytest.approx(3 * (5 * 2.50 + 16 * 10.00) / 1e6)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        assert tuple(reader.fieldnames or ()) == CSV_FIELDS
        return list(reader)


def test_csv_billing_export(start_sim: SimFactory, tmp_path: Path) -> None:
    path = tmp_path / "bill.csv"
    sim = start_sim("--latency", "fixed:0", "--ledger", str(path))
    sim.chat()
    with pytest.raises(httpx.ReadTimeout):
        sim.chat(headers={"X-Sim-Delay-Ms": "600"}, timeout=0.2)
    ledger = wait_for_billed(sim, 2)  # reading the ledger flushes the export
    rows = read_csv(path)
    assert [row["provider_request_id"] for row in rows] == [
        entry["provider_request_id"] for entry in ledger["entries"]
    ]
    assert [row["client_connected"] for row in rows] == ["true", "false"]
    assert rows[0]["finished_at"] == ledger["entries"][0]["finished_at"]
    assert float(rows[0]["cost_usd"]) == pytest.approx(ledger["entries"][0]["cost_usd"])

    sim.reset()  # the export is a billing history: a reset does not rewrite it
    sim.chat()
    sim.process.stop()  # a graceful stop flushes what is buffered
    assert len(read_csv(path)) == 3

    again = start_sim("--latency", "fixed:0", "--ledger", str(path))
    again.chat()
    again.process.stop()
    rows = read_csv(path)  # one header, at the top, rows appended
    assert len(rows) == 4
    assert path.read_text().count("provider_request_id") == 1


def test_csv_is_flushed_within_seconds_without_reading_the_ledger(
    start_sim: SimFactory, tmp_path: Path
) -> None:
    path = tmp_path / "bill.csv"
    sim = start_sim("--latency", "fixed:0", "--ledger", str(path))
    sim.chat()
    deadline = time.monotonic() + 10
    while path.read_text().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(read_csv(path)) == 1


def test_the_end_user_a_request_names_is_on_its_bill_line(fresh_sim: Sim) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    assert fresh_sim.post("/v1/chat/completions", {**body, "user": "order-7"}).status_code == 200
    message = {**body, "model": "claude-3-5-haiku-latest", "max_tokens": 8}
    sent = {**message, "metadata": {"user_id": "order-8"}}
    assert fresh_sim.post("/v1/messages", sent).status_code == 200
    assert fresh_sim.post("/v1/chat/completions", body).status_code == 200
    users = [entry["user"] for entry in fresh_sim.ledger()["entries"]]
    assert users == ["order-7", "order-8", ""]


def test_the_ledger_counts_generations_still_running(fresh_sim: Sim) -> None:
    with pytest.raises(httpx.ReadTimeout):
        fresh_sim.chat(headers={"X-Sim-Delay-Ms": "800"}, timeout=0.2)
    assert fresh_sim.ledger()["generating"] == 1, "still generating, to be billed"
    ledger = wait_for_billed(fresh_sim, 1)
    assert (ledger["generating"], ledger["billed"]) == (0, 1)
