"""Every figure of the hand-made scenario (tests/reconcile/data.py), in every input format."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from payonce.reconcile.run import ReconcileOptions, reconcile
from tests.reconcile import data

CALL_WRITERS: dict[str, tuple[Callable[[Path], Path], dict[str, str]]] = {
    "payonce-jsonl": (data.payonce_calls, {}),
    "payonce-jsonl-gz": (lambda d: data.payonce_calls(d, zipped=True), {}),
    "generic-csv": (data.generic_calls_csv, {}),
    "generic-jsonl": (data.generic_calls_jsonl, {}),
    "mapped-csv": (data.mapped_calls_csv, data.CALLS_MAP),
}

BILL_WRITERS: dict[str, tuple[Callable[[Path], Path], dict[str, str]]] = {
    "ledger-csv": (data.ledger_csv, {}),
    "litellm-csv": (data.litellm_csv, {}),
    "litellm-json": (data.litellm_json, {}),
    "generic-jsonl": (data.generic_bill_jsonl, {}),
    "mapped-csv-split-lines": (data.mapped_bill_csv, data.BILL_MAP),
}


def run(tmp_path: Path, calls: str, bill: str) -> dict[str, Any]:
    write_calls, calls_map = CALL_WRITERS[calls]
    write_bill, bill_map = BILL_WRITERS[bill]
    options = ReconcileOptions(calls_map=calls_map, bill_map=bill_map)
    report = reconcile([write_calls(tmp_path)], [write_bill(tmp_path)], options)
    return report.as_json()


def check(result: dict[str, Any], *, lines_per_generation: int = 1) -> None:
    expected = {
        **data.TOTALS,
        "bill_lines": 9 * lines_per_generation,
        "unmatched_bill_lines": lines_per_generation,
    }
    for field, value in expected.items():
        assert result[field] == pytest.approx(value, abs=1e-9), field
    assert set(result["by_model"]) == set(data.BY_MODEL)
    for model, figures in data.BY_MODEL.items():
        for field, value in figures.items():
            assert result["by_model"][model][field] == pytest.approx(value, abs=1e-9), (
                model,
                field,
            )
    assert [day["date"] for day in result["daily"]] == [d["date"] for d in data.DAILY]
    for day, expected_day in zip(result["daily"], data.DAILY, strict=True):
        for field, value in expected_day.items():
            assert day[field] == pytest.approx(value, abs=1e-9), (day["date"], field)
    outliers = result["outliers"]
    for field, value in data.OUTLIERS.items():
        assert outliers[field] == pytest.approx(value, abs=1e-9), field
    assert [o["provider_request_id"] for o in outliers["top"]] == ["r7"]
    assert outliers["top"][0]["model_median_usd"] == pytest.approx(0.1)
    assert [u["provider_request_id"] for u in result["unmatched_top"]] == ["r9"]
    assert result["unmatched_top"][0]["cost_usd"] == pytest.approx(0.4)


@pytest.mark.parametrize("calls", list(CALL_WRITERS))
def test_every_call_log_format_gives_the_same_figures(tmp_path: Path, calls: str) -> None:
    check(run(tmp_path, calls, "ledger-csv"))


@pytest.mark.parametrize("bill", list(BILL_WRITERS))
def test_every_bill_format_gives_the_same_figures(tmp_path: Path, bill: str) -> None:
    result = run(tmp_path, "payonce-jsonl", bill)
    # The split bill has two lines per generation: same generations, twice the lines.
    check(result, lines_per_generation=2 if bill == "mapped-csv-split-lines" else 1)


def test_formats_are_detected(tmp_path: Path) -> None:
    calls = data.payonce_calls(tmp_path)
    bills = [
        data.ledger_csv(tmp_path),
        data.litellm_csv(tmp_path),
        data.generic_bill_jsonl(tmp_path),
    ]
    report = reconcile([calls, data.generic_calls_csv(tmp_path)], bills)
    formats = [(i.side, i.format, i.container) for i in report.inputs]
    assert formats == [
        ("calls", "payonce", "jsonl"),
        ("calls", "generic", "csv"),
        ("bill", "ledger", "csv"),
        ("bill", "litellm", "csv"),
        ("bill", "generic", "jsonl"),
    ]


def test_breakdowns_by_endpoint_and_tag(tmp_path: Path) -> None:
    result = run(tmp_path, "payonce-jsonl", "ledger-csv")
    endpoint = result["by_endpoint"]["/v1/chat/completions"]
    assert endpoint["billed_generations"] == 9
    assert endpoint["wasted_cost_usd"] == pytest.approx(0.65)
    by_tag = result["by_tag"]
    assert set(by_tag) == {"t-a", "t-b", "(unknown)"}
    assert by_tag["t-a"]["billed_generations"] == 6
    assert by_tag["t-a"]["duplicate_generations"] == 3
    assert by_tag["t-a"]["business_requests"] == 3
    assert by_tag["t-a"]["successful_business_requests"] == 2
    assert by_tag["t-b"]["total_cost_usd"] == pytest.approx(1.1)
    assert by_tag["(unknown)"]["unmatched_cost_usd"] == pytest.approx(0.4)


def test_the_same_key_in_two_tenants_is_two_business_requests(tmp_path: Path) -> None:
    lines = [
        data.payonce_line(data.Call("K", "x1", 200, "m", "tenant-1", "2026-11-30T10:00:00Z")),
        data.payonce_line(data.Call("K", "x2", 200, "m", "tenant-2", "2026-11-30T10:00:00Z")),
    ]
    calls = data.write_jsonl(tmp_path / "calls.jsonl", lines)
    bill = data.write_csv(
        tmp_path / "bill.csv", ["provider_request_id", "cost_usd"], [["x1", "1"], ["x2", "2"]]
    )
    result = reconcile([calls], [bill]).as_json()
    assert result["business_requests"] == 2
    assert result["duplicate_generations"] == 0
    # Named explicitly, the key alone is the business id: then it is one request.
    mapped = reconcile([calls], [bill], ReconcileOptions(calls_map={"business_id": "key"}))
    assert mapped.totals.duplicate_generations == 1
    assert float(mapped.totals.wasted_cost_usd) == 2.0


def test_unprotected_retries_are_duplicates_of_a_call_that_cannot_be_named(tmp_path: Path) -> None:
    first = data.payonce_line(
        data.Call("x", "u1", 504, "m", "t", "2026-11-30T10:00:00Z", outcome="passthrough"),
        key=None,
        client_retry=0,
    )
    retry = data.payonce_line(
        data.Call("x", "u2", 200, "m", "t", "2026-11-30T10:00:30Z", outcome="passthrough"),
        key=None,
        client_retry=1,
        unprotected_retry=True,
    )
    rejected = data.payonce_line(
        data.Call("x", "", 400, "m", "t", "2026-11-30T10:00:40Z", outcome="rejected"),
        key=None,
        upstream_request_id=None,
    )
    calls = data.write_jsonl(tmp_path / "calls.jsonl", [first, retry, rejected])
    bill = data.write_csv(
        tmp_path / "bill.csv", ["provider_request_id", "cost_usd"], [["u1", "0.3"], ["u2", "0.5"]]
    )
    totals = reconcile([calls], [bill]).totals
    assert totals.billed_generations == 2
    assert totals.duplicate_generations == 1
    assert totals.unkeyed_retry_generations == 1
    assert float(totals.wasted_cost_usd) == 0.5
    # The first attempt and the rejected call are business requests of their own.
    assert totals.business_requests == 2
    assert totals.successful_business_requests == 0


def test_bill_lines_without_a_request_id_are_unmatched_spend(tmp_path: Path) -> None:
    calls = data.generic_calls_csv(tmp_path)
    bill = data.write_csv(
        tmp_path / "bill.csv",
        ["provider_request_id", "cost_usd"],
        [["r1", "0.1"], ["", "2.5"], ["", "0.5"]],
    )
    totals = reconcile([calls], [bill]).totals
    assert totals.billed_generations == 3
    assert totals.unmatched_bill_lines == 2
    assert float(totals.unmatched_cost_usd) == 3.0


def test_conflicting_request_ids_are_counted(tmp_path: Path) -> None:
    calls = data.write_csv(
        tmp_path / "calls.csv",
        ["business_id", "provider_request_id"],
        [["a", "p1"], ["b", "p1"], ["c", "p2"]],
    )
    bill = data.write_csv(
        tmp_path / "bill.csv", ["provider_request_id", "cost_usd"], [["p1", "1"], ["p2", "1"]]
    )
    report = reconcile([calls], [bill])
    assert report.conflicting_request_ids == 1
    assert report.totals.duplicate_generations == 0
    # Without a status column, every business request counts as successful.
    assert report.totals.successful_business_requests == 3


def test_without_timestamps_there_is_no_daily_trend(tmp_path: Path) -> None:
    calls = data.write_csv(
        tmp_path / "calls.csv", ["business_id", "provider_request_id"], [["a", "p1"]]
    )
    bill = data.write_csv(tmp_path / "bill.csv", ["provider_request_id", "cost_usd"], [["p1", "1"]])
    report = reconcile([calls], [bill])
    assert report.daily == ()
    assert report.period_start is None
    assert report.as_json()["period"] == {"start": None, "end": None}


def test_a_dotted_path_reads_a_nested_json_field(tmp_path: Path) -> None:
    records: list[dict[str, object]] = [
        {"order": "a", "provider_request_id": "p1", "meta": {"team": "search"}},
        {"order": "a", "provider_request_id": "p2", "meta": {"team": "search"}},
        {"order": "b", "provider_request_id": "p3", "meta": {"team": "ads"}},
    ]
    calls = data.write_jsonl(tmp_path / "calls.jsonl", records)
    bill = data.write_csv(
        tmp_path / "bill.csv",
        ["provider_request_id", "cost_usd"],
        [["p1", "1"], ["p2", "3"], ["p3", "2"]],
    )
    options = ReconcileOptions(calls_map={"business_id": "order", "tag": "meta.team"})
    by_tag = reconcile([calls], [bill], options).as_json()["by_tag"]
    assert by_tag["search"]["duplicate_generations"] == 1
    assert by_tag["search"]["wasted_cost_usd"] == 3.0  # p1 (1.00) was the cheapest
    assert by_tag["ads"]["total_cost_usd"] == 2.0


def test_a_listed_outlier_names_its_business_id_keyed_or_not(tmp_path: Path) -> None:
    # The join carries ids as hashes; the listing must find the id each hash came
    # from, including the random one a line without a business id gets.
    rows = [[f"b{i}", f"p{i}", "m"] for i in range(6)] + [["", "p6", "m"], ["b7", "p7", "m"]]
    calls = data.write_csv(
        tmp_path / "calls.csv", ["business_id", "provider_request_id", "model"], rows
    )
    costs = ["0.1"] * 6 + ["9", "8"]
    bill = data.write_csv(
        tmp_path / "bill.csv",
        ["provider_request_id", "cost_usd", "model"],
        [[f"p{i}", cost, "m"] for i, cost in enumerate(costs)],
    )
    top = reconcile([calls], [bill]).outliers.top
    assert [(o.provider_request_id, o.business_id is not None) for o in top] == [
        ("p6", True),
        ("p7", True),
    ]
    assert top[0].business_id is not None and top[0].business_id.startswith("#")
    assert top[1].business_id == "b7"


def test_figures_by_scenario_and_endpoint_from_the_call_log(tmp_path: Path) -> None:
    """Issue 34: the call log's scenario and endpoint, as reconcile's tag and endpoint."""
    from payonce.reconcile.html import render_html

    scenario = {"t-a": "invoice-summary", "t-b": "support-bot"}
    lines = [
        data.payonce_line(call, v=2, endpoint="chat", scenario=scenario.get(call.tenant))
        for call in data.CALLS
    ]
    calls = data.write_jsonl(tmp_path / "calls.jsonl", lines)
    options = ReconcileOptions(calls_map={"tag": "scenario", "endpoint": "endpoint"})
    report = reconcile([calls], [data.ledger_csv(tmp_path)], options)
    result = report.as_json()
    by_tag = result["by_tag"]
    assert set(by_tag) == {"invoice-summary", "support-bot", "(unknown)"}
    assert by_tag["invoice-summary"]["billed_generations"] == 6
    assert by_tag["invoice-summary"]["duplicate_generations"] == 3
    assert by_tag["support-bot"]["total_cost_usd"] == pytest.approx(1.1)
    # The matched generations by the call log's endpoint; the unmatched bill line keeps
    # the bill's own name of its endpoint (a path).
    assert result["by_endpoint"]["chat"]["billed_generations"] == 8
    assert result["by_endpoint"]["/v1/chat/completions"]["billed_generations"] == 1
    page = render_html(report, ())
    assert "By tag" in page and "invoice-summary" in page and "support-bot" in page


def test_the_call_logs_scenario_and_endpoint_are_read_by_default(tmp_path: Path) -> None:
    """Without --calls-map: the scenario when the head of the log names one, the endpoint
    when the field is there; else the tenant and the path, as before."""
    scenario = {"t-a": "invoice-summary", "t-b": "support-bot"}
    named = [
        data.payonce_line(call, v=2, endpoint="chat", scenario=scenario[call.tenant])
        for call in data.CALLS
    ]
    calls = data.write_jsonl(tmp_path / "calls.jsonl", named)
    result = reconcile([calls], [data.ledger_csv(tmp_path)]).as_json()
    assert (result["tag_column"], result["endpoint_column"]) == ("scenario", "endpoint")
    assert set(result["by_tag"]) == {"invoice-summary", "support-bot", "(unknown)"}
    assert result["by_endpoint"]["chat"]["billed_generations"] == 8
    # No scenario in the log's first lines: the tenant stays the tag.
    unnamed = [data.payonce_line(call, v=2, endpoint="chat", scenario=None) for call in data.CALLS]
    calls = data.write_jsonl(tmp_path / "unnamed.jsonl", unnamed)
    result = reconcile([calls], [data.ledger_csv(tmp_path)]).as_json()
    assert (result["tag_column"], result["endpoint_column"]) == ("tenant", "endpoint")
    assert set(result["by_tag"]) == {"t-a", "t-b", "(unknown)"}
    # A version 1 log (neither field): the tenant and the path.
    old = data.write_jsonl(tmp_path / "v1.jsonl", [data.payonce_line(c) for c in data.CALLS])
    result = reconcile([old], [data.ledger_csv(tmp_path)]).as_json()
    assert (result["tag_column"], result["endpoint_column"]) == ("tenant", "path")
    assert result["stated_costs"]["calls"] == 0


def test_stated_costs_compare_the_providers_cost_with_the_list_price(tmp_path: Path) -> None:
    stated = {"r1": (0.10, 0.08), "r2": (0.30, None), "r3": (0.20, 0.25)}
    lines = []
    for call in data.CALLS:
        cost, listed = stated.get(call.pid, (0.05, None))
        source = "provider" if call.pid in stated else "genai-prices"
        lines.append(
            data.payonce_line(
                call,
                v=2,
                endpoint="chat",
                cost_usd=0.0 if call.outcome == "replayed" else cost,
                price_source=source,
                list_cost_usd=None if call.outcome == "replayed" else listed,
            )
        )
    replay = data.payonce_line(data.CALLS[0], v=2, outcome="replayed", cost_usd=0.0)
    lines.append({**replay, "price_source": "provider", "saved_usd": 0.10})
    calls = data.write_jsonl(tmp_path / "calls.jsonl", lines)
    report = reconcile([calls], [data.ledger_csv(tmp_path)])
    figure = report.as_json()["stated_costs"]
    assert figure["calls"] == 3 and figure["calls_with_list_price"] == 2
    assert figure["stated_cost_usd"] == pytest.approx(0.60)
    assert figure["compared_stated_cost_usd"] == pytest.approx(0.30)
    assert figure["list_cost_usd"] == pytest.approx(0.33)
    assert figure["difference_usd"] == pytest.approx(-0.03)
    from payonce.reconcile.html import render_html

    page = render_html(report, ())
    assert "Stated costs" in page and "have no list price" in page
