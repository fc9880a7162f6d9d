"""Reconciling against aggregated usage and cost reports, on hand-made exports.

Every figure below is worked out by hand from the scenario:

OpenAI, hourly buckets 10:00, 11:00, 12:00 of 2026-11-30 (gpt-4o-mini, $0.15/$0.60
per million tokens); tenant ``ta`` bills to key ``key_a``, tenant ``tb`` to ``key_b``.

- 10:00, ``key_a``: k1 forwarded (100 in, 10 out) and replayed once; an unkeyed call
  (50/5) and its unprotected retry (50/5). Billed: 3 requests, 200/20. Duplicates: 1.
- 11:00, ``key_b``: k2 forwarded twice (the documented double bill), 100/10 each.
  Billed: 4 requests, 400/40: 2 requests and 200/20 tokens nobody logged.
- 12:00: nothing logged; ``key_z`` (not in the map) billed 1 request, 10/1.
- 13:30: a call after the report ends.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from payonce.errors import ConfigError
from payonce.reconcile.keymap import read_key_map
from payonce.reconcile.run import ReconcileOptions, reconcile
from payonce.reconcile.usage_report import UsageReport

DAY = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
H10 = int((DAY + dt.timedelta(hours=10)).timestamp())
HOUR = 3600
PRICE_IN, PRICE_OUT = 0.15e-6, 0.6e-6


def call(
    minute: float,
    *,
    key: str | None,
    tenant: str,
    outcome: str = "forwarded",
    tokens: tuple[int, int] | None = (100, 10),
    retry: bool = False,
    path: str = "/v1/chat/completions",
    model: str = "gpt-4o-mini",
    hour: int = 10,
) -> dict[str, Any]:
    ts = DAY + dt.timedelta(hours=hour, minutes=minute)
    sent = outcome in ("forwarded", "passthrough")
    cost = (tokens[0] * PRICE_IN + tokens[1] * PRICE_OUT) if tokens else None
    return {
        "v": 2,
        "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "request_id": f"r{minute}-{hour}",
        "key": key,
        "tenant": tenant,
        "method": "POST",
        "path": path,
        "model": model,
        "stream": False,
        "outcome": outcome,
        "status": 200,
        "client_disconnected": False,
        "upstream_status": 200 if sent else None,
        "upstream_request_id": f"chatcmpl-{minute}-{hour}" if sent else None,
        "upstream_attempts": 1 if sent else 0,
        "upstream_cancelled": False,
        "client_retry": 1 if retry else None,
        "unprotected_retry": retry,
        "store_bypassed": False,
        "input_tokens": tokens[0] if tokens else None,
        "output_tokens": tokens[1] if tokens else None,
        "cost_usd": cost if sent else 0,
        "latency_ms": 10.0,
    }


def scenario_calls(directory: Path) -> Path:
    lines = [
        call(1, key="k1", tenant="ta"),
        call(2, key="k1", tenant="ta", outcome="replayed"),
        call(3, key=None, tenant="ta", outcome="passthrough", tokens=(50, 5)),
        call(4, key=None, tenant="ta", outcome="passthrough", tokens=(50, 5), retry=True),
        call(5, key="k2", tenant="tb", hour=11),
        call(6, key="k2", tenant="tb", hour=11),
        call(30, key="k3", tenant="ta", hour=13),
    ]
    path = directory / "calls.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def openai_result(
    model: str, key: str | None, requests: int, tokens: tuple[int, int]
) -> dict[str, Any]:
    return {
        "object": "organization.usage.completions.result",
        "input_tokens": tokens[0],
        "output_tokens": tokens[1],
        "input_cached_tokens": 0,
        "input_audio_tokens": 0,
        "output_audio_tokens": 0,
        "num_model_requests": requests,
        "project_id": None,
        "user_id": None,
        "api_key_id": key,
        "model": model,
        "batch": None,
        "service_tier": None,
    }


def bucket(start: int, results: list[dict[str, Any]], width: int = HOUR) -> dict[str, Any]:
    return {"object": "bucket", "start_time": start, "end_time": start + width, "results": results}


def page(buckets: list[dict[str, Any]], next_page: str | None = None) -> dict[str, Any]:
    return {
        "object": "page",
        "data": buckets,
        "has_more": next_page is not None,
        "next_page": next_page,
    }


SNAPSHOT = "gpt-4o-mini-2024-07-18"


def scenario_pages() -> list[dict[str, Any]]:
    return [
        page(
            [
                bucket(H10, [openai_result(SNAPSHOT, "key_a", 3, (200, 20))]),
                bucket(H10 + HOUR, [openai_result(SNAPSHOT, "key_b", 4, (400, 40))]),
            ],
            next_page="page_AAA",
        ),
        page([bucket(H10 + 2 * HOUR, [openai_result(SNAPSHOT, "key_z", 1, (10, 1))])]),
    ]


def key_map(directory: Path) -> Path:
    path = directory / "keys.json"
    path.write_text(json.dumps({"ta": "key_a", "tb": "key_b"}))
    return path


def run(calls: Path, bills: list[Path], **options: Any) -> UsageReport:
    report = reconcile([calls], bills, ReconcileOptions(**options))
    assert isinstance(report, UsageReport)
    return report


def tokens_cost(tokens_in: int, tokens_out: int) -> float:
    return round(tokens_in * PRICE_IN + tokens_out * PRICE_OUT, 10)


@pytest.mark.parametrize("layout", ["jsonl", "array", "gzip"])
def test_every_figure_by_key(tmp_path: Path, layout: str) -> None:
    pages = scenario_pages()
    export = tmp_path / "usage.json"
    if layout == "jsonl":
        export.write_text("".join(json.dumps(p) + "\n" for p in pages))
    elif layout == "array":
        export.write_text(json.dumps(pages, indent=2))
    else:
        export = tmp_path / "usage.json.gz"
        export.write_bytes(gzip.compress("".join(json.dumps(p) + "\n" for p in pages).encode()))
    report = run(scenario_calls(tmp_path), [export], key_map=read_key_map(key_map(tmp_path)))
    document = report.as_json()
    assert document["bucket_width_s"] == {"openai-usage": 3600}
    assert document["key_column"] == "api_key_id"
    totals = report.totals
    assert totals.billed_requests == 8
    assert totals.logged_upstream_calls == 5
    assert totals.business_requests == 3  # k1, the unkeyed call, k2 (k3 is outside)
    assert totals.duplicate_requests == 2  # the unprotected retry, k2's second run
    assert totals.unexplained_requests == 3  # 2 on key_b, 1 on key_z
    assert totals.unbilled_calls == 0
    assert (totals.billed_input_tokens, totals.billed_output_tokens) == (610, 61)
    assert (totals.logged_input_tokens, totals.logged_output_tokens) == (400, 40)
    assert (totals.unexplained_input_tokens, totals.unexplained_output_tokens) == (210, 21)
    assert document["unexplained_tokens"] == 231
    assert document["unexplained_cost_usd"] == tokens_cost(210, 21)
    assert document["unexplained_cost_basis"] == "price table"
    assert document["wasted_cost_usd"] == tokens_cost(150, 15)
    assert document["billed_cost_usd"] == tokens_cost(610, 61)
    assert document["duplicate_ratio"] == 2 / 8
    assert document["calls_outside_reports"] == {"outside the usage reports' buckets": 1}
    by_key = document["by_key"]
    assert by_key["key_a"]["unexplained_requests"] == 0
    assert by_key["key_a"]["duplicate_requests"] == 1
    assert by_key["key_b"]["unexplained_requests"] == 2
    assert by_key["key_b"]["unexplained_input_tokens"] == 200
    assert by_key["(keys not in --key-map)"]["unexplained_requests"] == 1
    assert list(document["by_model"]) == ["gpt-4o-mini"]  # the snapshot is the same model
    buckets = {b["start"]: b for b in document["buckets"]}
    assert [b["flagged"] for b in document["buckets"]] == [False, True, True]
    assert buckets["2026-11-30T11:00:00Z"]["unexplained_requests"] == 2
    assert buckets["2026-11-30T10:00:00Z"]["duplicate_requests"] == 1
    assert document["flagged_buckets"] == 2
    (summary,) = [i for i in document["inputs"] if i["side"] == "bill"]
    assert summary["format"] == "openai-usage" and summary["rows"] == 3
    assert document["not_computed"] == {}


def test_without_a_key_map_all_keys_are_one(tmp_path: Path) -> None:
    export = tmp_path / "usage.jsonl"
    export.write_text("".join(json.dumps(p) + "\n" for p in scenario_pages()))
    report = run(scenario_calls(tmp_path), [export])
    assert report.totals.unexplained_requests == 3
    assert report.by_key == ()
    assert report.key_column is None


def test_tolerance_absorbs_small_token_differences(tmp_path: Path) -> None:
    # The provider counts 1% more input tokens than the log in 10:00, and 2% in 11:00.
    pages = [
        page(
            [
                bucket(H10, [openai_result(SNAPSHOT, None, 3, (202, 20))]),
                bucket(H10 + HOUR, [openai_result(SNAPSHOT, None, 2, (204, 20))]),
            ]
        )
    ]
    export = tmp_path / "usage.jsonl"
    export.write_text(json.dumps(pages[0]) + "\n")
    report = run(scenario_calls(tmp_path), [export])
    flags = [b.figures.flagged for b in report.buckets]
    assert flags == [False, True]
    assert report.buckets[1].figures.unexplained_input_tokens == 4
    loose = run(scenario_calls(tmp_path), [export], token_tolerance=0.05)
    assert [b.figures.flagged for b in loose.buckets] == [False, False]
    # Over the whole period 406 billed against 400 logged: 1.5%, above 1%.
    assert report.totals.unexplained_input_tokens == 6
    assert loose.totals.unexplained_input_tokens == 0


def test_a_bucket_the_log_has_no_calls_for_and_an_export_that_starts_late(tmp_path: Path) -> None:
    # The export covers 11:00-13:00 only: the 10:00 calls are outside it.
    pages = [
        page(
            [
                bucket(H10 + HOUR, [openai_result(SNAPSHOT, None, 2, (200, 20))]),
                bucket(H10 + 2 * HOUR, []),
            ]
        )
    ]
    export = tmp_path / "usage.jsonl"
    export.write_text(json.dumps(pages[0]) + "\n")
    report = run(scenario_calls(tmp_path), [export])
    assert [b.key for b in report.buckets] == ["2026-11-30T11:00:00Z", "2026-11-30T12:00:00Z"]
    assert report.buckets[1].figures.billed_requests == 0
    assert report.buckets[1].figures.flagged is False
    assert report.totals.unexplained_requests == 0
    assert report.totals.logged_upstream_calls == 2
    assert report.calls_outside == {"outside the usage reports' buckets": 5}


def test_a_business_request_across_rotated_logs_and_buckets(tmp_path: Path) -> None:
    # k4 is sent at 10:59 (300/30) and again, cheaper, at 11:00 from the next log:
    # it is one business request, counted at 10:00 (its first line), and the call
    # it needed is the cheaper one, so the 10:00 call is the duplicate.
    first, second = tmp_path / "calls.jsonl.1", tmp_path / "calls.jsonl"
    first.write_text(
        json.dumps(call(1, key="k1", tenant="ta"))
        + "\n"
        + json.dumps(call(59.5, key="k4", tenant="ta", tokens=(300, 30)))
        + "\n"
    )
    second.write_text(json.dumps(call(0.5, key="k4", tenant="ta", hour=11)) + "\nnot json\n")
    export = tmp_path / "usage.jsonl"
    pages = [
        page(
            [
                bucket(H10, [openai_result(SNAPSHOT, None, 2, (400, 40))]),
                bucket(H10 + HOUR, [openai_result(SNAPSHOT, None, 1, (100, 10))]),
            ]
        )
    ]
    export.write_text(json.dumps(pages[0]) + "\n")
    report = reconcile([first, second], [export], ReconcileOptions())
    assert isinstance(report, UsageReport)
    totals = report.totals
    assert (totals.logged_upstream_calls, totals.business_requests) == (3, 2)
    assert (totals.duplicate_requests, totals.unexplained_requests) == (1, 0)
    assert report.as_json()["wasted_cost_usd"] == tokens_cost(300, 30)
    ten, eleven = (b.figures for b in report.buckets)
    assert (ten.business_requests, ten.duplicate_requests) == (2, 1)
    assert (eleven.business_requests, eleven.duplicate_requests) == (0, 0)
    assert report.malformed_rows == 1
    assert [(i.rows, i.malformed_rows) for i in report.inputs if i.side == "calls"] == [
        (2, 0),
        (1, 1),
    ]


def test_a_log_written_to_while_it_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The calls are read twice; a line appended in between would be counted
    # without its duplicates. Appending during the first pass stands for a gateway
    # still writing the log.
    from payonce.reconcile import usage_analysis

    calls = scenario_calls(tmp_path)
    first_pass = usage_analysis.scan_source

    def appending(*args: Any, **kwargs: Any) -> bool:
        lenient = first_pass(*args, **kwargs)
        with calls.open("a") as log:
            log.write(json.dumps(call(7, key="k1", tenant="ta")) + "\n")
        return lenient

    monkeypatch.setattr(usage_analysis, "scan_source", appending)
    export = tmp_path / "usage.jsonl"
    export.write_text("".join(json.dumps(p) + "\n" for p in scenario_pages()))
    with pytest.raises(ConfigError, match="changed while it was read"):
        run(calls, [export])


def anthropic_page(results_by_hour: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    data = []
    for hour, results in sorted(results_by_hour.items()):
        start = DAY + dt.timedelta(hours=hour)
        data.append(
            {
                "starting_at": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "ending_at": (start + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "results": results,
            }
        )
    return {"data": data, "has_more": False, "next_page": None}


def anthropic_result(uncached: int, read: int, created: int, out: int) -> dict[str, Any]:
    return {
        "uncached_input_tokens": uncached,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": created},
        "cache_read_input_tokens": read,
        "output_tokens": out,
        "server_tool_use": {"web_search_requests": 0},
        "api_key_id": "apikey_01",
        "workspace_id": None,
        "model": "claude-sonnet-4-20250514",
        "service_tier": "standard",
        "context_window": "0-200k",
    }


def test_anthropic_has_no_request_counts_and_says_so(tmp_path: Path) -> None:
    lines = [
        call(1, key="a1", tenant="ta", path="/v1/messages", model="claude-sonnet-4-20250514"),
        call(2, key="a1", tenant="ta", path="/v1/messages", model="claude-sonnet-4-20250514"),
    ]
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps(line) + "\n" for line in lines))
    export = tmp_path / "anthropic.json"
    # 60 uncached + 100 read + 40 written = 200 input tokens; 20 logged + 40 more billed.
    export.write_text(json.dumps(anthropic_page({10: [anthropic_result(60, 100, 40, 60)]})))
    report = run(calls, [export])
    document = report.as_json()
    assert document["billed_requests"] is None
    assert document["unexplained_requests"] is None
    assert document["duplicate_ratio"] is None
    assert document["duplicate_requests"] == 1
    assert document["billed_input_tokens"] == 200
    assert document["unexplained_output_tokens"] == 40
    assert "billed_requests" in document["not_computed"]
    assert "no request count" in document["not_computed"]["unexplained_requests"]
    assert document["duplicate_cost_ratio"] is not None


def test_cost_reports_are_compared_per_day(tmp_path: Path) -> None:
    costs = {
        "object": "page",
        "data": [
            {
                "object": "bucket",
                "start_time": int(DAY.timestamp()),
                "end_time": int(DAY.timestamp()) + 86400,
                "results": [
                    {
                        "object": "organization.costs.result",
                        "amount": {"value": 0.01, "currency": "usd"},
                        "line_item": "gpt-4o-mini, input",
                        "project_id": None,
                    }
                ],
            }
        ],
        "has_more": False,
        "next_page": None,
    }
    export = tmp_path / "costs.json"
    export.write_text(json.dumps(costs))
    usage = tmp_path / "usage.jsonl"
    usage.write_text("".join(json.dumps(p) + "\n" for p in scenario_pages()))
    report = run(scenario_calls(tmp_path), [usage, export])
    document = report.as_json()
    logged = sum(
        tokens_cost(*t) for t in [(100, 10), (50, 5), (50, 5), (100, 10), (100, 10), (100, 10)]
    )
    assert document["cost_report"]["billed_cost_usd"] == 0.01
    assert document["cost_report"]["logged_cost_usd"] == pytest.approx(logged, abs=1e-9)
    assert document["unexplained_cost_basis"] == "cost report"
    assert document["unexplained_cost_usd"] == pytest.approx(0.01 - logged, abs=1e-9)


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    calls = scenario_calls(tmp_path)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(page([bucket(H10, [])])))
    with pytest.raises(ConfigError, match="name it with --bill-format"):
        run(calls, [empty])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        json.dumps(page([bucket(H10, [openai_result("m", None, 1, (1, 1))])]))
        + "\n"
        + json.dumps(page([bucket(H10, [openai_result("m", None, 1, (1, 1))], width=86400)]))
        + "\n"
    )
    with pytest.raises(ConfigError, match="mix bucket widths"):
        run(calls, [mixed])
    ledger = tmp_path / "ledger.csv"
    ledger.write_text(
        "provider_request_id,cost_usd,finished_at,client_connected\nx,1,2026-11-30T10:00:00Z,true\n"
    )
    usage = tmp_path / "usage.jsonl"
    usage.write_text(json.dumps(scenario_pages()[0]) + "\n")
    with pytest.raises(ConfigError, match="cannot be reconciled in the same run"):
        run(calls, [usage, ledger])
    bad_map = tmp_path / "bad.json"
    bad_map.write_text(json.dumps({"ta": "key_a", "tb": "proj_b"}))
    with pytest.raises(ConfigError, match="mixes API key ids and project ids"):
        read_key_map(bad_map)
    projects = tmp_path / "projects.json"
    projects.write_text(json.dumps({"ta": "proj_a"}))
    with pytest.raises(ConfigError, match="not grouped by project_id"):
        run(calls, [usage], key_map=read_key_map(projects))


def test_notes_missing_pages_and_repeats(tmp_path: Path) -> None:
    first = scenario_pages()[0]  # says has_more, and its next page is not given
    export = tmp_path / "usage.jsonl"
    export.write_text(json.dumps(first) + "\n" + json.dumps(first) + "\n")
    report = run(scenario_calls(tmp_path), [export])
    (summary,) = [i for i in report.inputs if i.side == "bill"]
    assert "has_more" in summary.note and "page_AAA" in summary.note
    assert "repeated exactly" in summary.note
    assert report.totals.billed_requests == 7


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payonce", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_command_line_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    calls = scenario_calls(tmp_path)
    usage = tmp_path / "usage.jsonl"
    usage.write_text("".join(json.dumps(p) + "\n" for p in scenario_pages()))
    cases = [
        (["--key-map", str(tmp_path / "none.json")], "--key-map: "),
        (["--token-tolerance", "2"], "--token-tolerance: expected a share below 1"),
        (["--token-tolerance", "x"], "--token-tolerance: expected a number"),
        (["--max-unexplained-cost", "-1"], "--max-unexplained-cost: must not be negative"),
    ]
    for extra, needle in cases:
        result = cli("reconcile", "--calls", str(calls), "--bill", str(usage), *extra)
        assert result.returncode == 2, result.stderr
        assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_forced_format_and_alerts(tmp_path: Path) -> None:
    calls = scenario_calls(tmp_path)
    usage = tmp_path / "usage.txt"
    usage.write_text("".join(json.dumps(p) + "\n" for p in scenario_pages()))
    out = tmp_path / "out.json"
    result = cli(
        "reconcile",
        "--calls",
        str(calls),
        "--bill",
        str(usage),
        "--bill-format",
        "openai-usage",
        "--max-duplicate-ratio",
        "0.2",
        "--json",
        str(out),
    )
    assert result.returncode == 3, result.stderr
    document = json.loads(out.read_text())
    assert document["schema"] == "payonce.reconcile.usage/1"
    assert [a["metric"] for a in document["alerts"]] == ["duplicate_ratio"]
    assert "ALERT: duplicate_ratio 0.25 is above --max-duplicate-ratio 0.2" in result.stdout


def test_tenant_id_never_echoes_the_credential() -> None:
    result = cli("tenant-id", stdin="sk-secret-value-123\nBearer sk-secret-value-123\n")
    assert result.returncode == 0
    first, second = result.stdout.split()
    assert first == second and len(first) == 32
    assert "sk-secret" not in result.stdout + result.stderr
    empty = cli("tenant-id", stdin="\n")
    assert empty.returncode == 2 and "no credential" in empty.stderr
