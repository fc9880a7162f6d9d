"""``payonce reconcile`` as cron and CI run it: outputs, exit codes, errors, the webhook."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from payonce.cli import main
from payonce.reconcile.cli import spread_multi_value
from tests.reconcile import data


def run(*args: str) -> int:
    try:
        main(["reconcile", *args])
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    return str(data.payonce_calls(tmp_path)), str(data.ledger_csv(tmp_path))


def test_summary_json_and_exit_code_0(
    files: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls, bill = files
    out = tmp_path / "out.json"
    assert run("--calls", calls, "--bill", bill, "--json", str(out)) == 0
    screen = capsys.readouterr().out
    assert "Duplicate generations" in screen and "33.33%" in screen and "$0.51" in screen
    result = json.loads(out.read_text())
    for field in (
        "billed_generations",
        "business_requests",
        "duplicate_generations",
        "duplicate_ratio",
        "wasted_cost_usd",
        "total_cost_usd",
        "cost_per_successful_call_usd",
        "unmatched_bill_lines",
        "unmatched_cost_usd",
        "by_model",
    ):
        assert field in result
    assert result["status"] == "ok"
    assert result["wasted_cost_usd"] == 0.65


def test_json_to_stdout_keeps_the_summary_off_it(
    files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    calls, bill = files
    assert run("--calls", calls, "--bill", bill, "--json", "-") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["billed_generations"] == 9
    assert "Duplicate generations" in captured.err


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        (["--max-duplicate-ratio", "0.3"], 3),  # 3/9 is above 0.3
        (["--max-duplicate-ratio", "0.34"], 0),
        (["--max-cost-per-call", "0.5"], 3),  # 2.55 / 5 = 0.51
        (["--max-cost-per-call", "0.51"], 0),
        (["--max-duplicate-ratio", "0.5", "--max-cost-per-call", "0.4"], 3),
    ],
)
def test_thresholds_exit_3(
    files: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    code: int,
) -> None:
    calls, bill = files
    out = tmp_path / "out.json"
    assert run("--calls", calls, "--bill", bill, "-q", "--json", str(out), *flags) == code
    result = json.loads(out.read_text())
    assert result["status"] == ("alert" if code else "ok")
    assert ("ALERT" in capsys.readouterr().err) is bool(code)


def test_several_files_after_one_flag(tmp_path: Path) -> None:
    # Rotated logs: the gateway writes PATH, PATH.1, ...; a glob passes them all.
    first = data.write_jsonl(
        tmp_path / "calls.jsonl.1", [data.payonce_line(c) for c in data.CALLS[:5]]
    )
    second = data.write_jsonl(
        tmp_path / "calls.jsonl", [data.payonce_line(c) for c in data.CALLS[5:]]
    )
    bill = data.ledger_csv(tmp_path)
    out = tmp_path / "out.json"
    code = run("--calls", str(first), str(second), "--bill", str(bill), "-q", "--json", str(out))
    assert code == 0
    result = json.loads(out.read_text())
    assert result["duplicate_generations"] == 3
    assert len(result["inputs"]) == 3


def test_spread_multi_value() -> None:
    assert spread_multi_value(["--calls", "a", "b", "--bill", "c", "-q", "x"]) == [
        "--calls", "a", "--calls", "b", "--bill", "c", "-q", "x",
    ]  # fmt: skip
    assert spread_multi_value(["--calls", "-", "--json", "-"]) == ["--calls", "-", "--json", "-"]


def test_malformed_rows_are_reported_with_line_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.dumps(data.payonce_line(c)) for c in data.CALLS]
    lines.insert(2, "{this is not json")  # line 3
    lines.insert(5, "")  # line 6: blank, skipped
    lines.insert(7, json.dumps(data.payonce_line(data.CALLS[0], ts="yesterday")))  # line 8
    calls = tmp_path / "calls.jsonl"
    calls.write_text("\n".join(lines) + "\n")
    bill = data.ledger_csv(tmp_path)
    with bill.open("a") as handle:
        handle.write("r11,gpt-4o,/v1/chat/completions,1,1,lots,2026-12-01T00:00:00Z,true\n")  # 11
        handle.write("r12,gpt-4o,/v1/chat/completions,1,1,,2026-12-01T00:00:00Z,true\n")  # 12
        handle.write("r13,gpt-4o,/v1/chat/completions,1,1,0.1,2026-12-01T00:00:00Z\n")  # 13
    out = tmp_path / "out.json"
    assert run("--calls", str(calls), "--bill", str(bill), "--json", str(out)) == 0
    result = json.loads(out.read_text())
    found = [(Path(m["file"]).name, m["line"], m["reason"]) for m in result["malformed"]]
    assert [(name, line) for name, line, _ in found] == [
        ("calls.jsonl", 3),
        ("calls.jsonl", 8),
        ("ledger.csv", 11),
        ("ledger.csv", 12),
        ("ledger.csv", 13),
    ]
    reasons = [reason for _, _, reason in found]
    assert reasons[0] == "not a JSON object"
    assert reasons[1] == "ts: not a timestamp: yesterday"
    assert "lots" in reasons[2] and "cost_usd" in reasons[2]
    assert reasons[3] == 'column "cost_usd": empty'
    assert "too few columns" in reasons[4]
    assert result["malformed_rows"] == 5
    # The good rows still give every figure of the scenario.
    assert result["duplicate_generations"] == 3
    assert result["total_cost_usd"] == 2.55
    assert [i["malformed_rows"] for i in result["inputs"]] == [2, 3]
    # The ledger's rows end in CRLF (Python's csv module), the appended ones in LF.
    assert "read leniently" in result["inputs"][1]["note"]
    screen = capsys.readouterr().out
    assert "calls.jsonl:3: not a JSON object" in screen
    assert "read leniently" in screen


def test_rows_with_extra_columns_are_malformed(tmp_path: Path) -> None:
    calls = data.generic_calls_csv(tmp_path)
    bill = tmp_path / "bill.csv"
    bill.write_text("provider_request_id,cost_usd\nr1,0.1\nr2,0.3,surprise\nr3,0.2\n")
    out = tmp_path / "out.json"
    assert run("--calls", str(calls), "--bill", str(bill), "-q", "--json", str(out)) == 0
    result = json.loads(out.read_text())
    [row] = result["malformed"]
    assert row["line"] == 3
    assert "too many columns" in row["reason"]
    assert result["inputs"][1]["note"] is None
    assert result["total_cost_usd"] == 0.3


@pytest.mark.parametrize(
    ("make_calls", "make_bill", "flags", "needle"),
    [
        (
            lambda d: data.write_csv(d / "c.csv", ["business_id", "model"], [["a", "m"]]),
            data.ledger_csv,
            [],
            "missing column 'provider_request_id'",
        ),
        (
            data.generic_calls_csv,
            lambda d: data.write_csv(d / "b.csv", ["provider_request_id", "amount"], [["a", "1"]]),
            [],
            "missing column 'cost_usd'",
        ),
        (
            data.generic_calls_csv,
            data.ledger_csv,
            ["--calls-map", "business_id=order_no"],
            "missing column 'order_no'",
        ),
        (
            data.generic_calls_csv,
            data.ledger_csv,
            ["--bill-map", "price=x"],
            "unknown field 'price'",
        ),
        (data.generic_calls_csv, data.ledger_csv, ["--max-duplicate-ratio", "lots"], "--max-dup"),
        (data.generic_calls_csv, data.ledger_csv, ["--webhook", "ftp://x"], "--webhook"),
        (lambda d: d / "absent.jsonl", data.ledger_csv, [], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make_calls: object,
    make_bill: object,
    flags: list[str],
    needle: str,
) -> None:
    calls = make_calls(tmp_path)  # type: ignore[operator]
    bill = make_bill(tmp_path)  # type: ignore[operator]
    assert run("--calls", str(calls), "--bill", str(bill), *flags) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1
    assert err.startswith("payonce: error:")


def test_missing_column_from_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    calls = data.write_csv(tmp_path / "c.csv", ["order", "req"], [["a", "b"]])
    bill = data.ledger_csv(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "payonce", "reconcile", "--calls", str(calls), "--bill", str(bill)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1
    assert "missing column 'business_id'" in done.stderr
    assert "--calls-map business_id=COLUMN" in done.stderr


def test_a_json_lines_bill_with_a_line_not_utf8_names_that_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = data.write_csv(
        tmp_path / "c.csv", ["business_id", "provider_request_id"], [["order-1", "a"]]
    )
    line = '{"provider_request_id":"%s","model":"gpt-4o-mini","cost_usd":0.1}\n'
    bill = tmp_path / "bill.jsonl"
    bill.write_bytes((line % "a").encode() + (line % "b").encode().replace(b"b", b"b\xff", 1))
    assert run("--calls", str(calls), "--bill", str(bill)) == 2
    error = capsys.readouterr().err
    # DuckDB's own words ("CSV Error on Line: 2") would name the wrong kind of file.
    assert error == f"payonce: error: {bill}: cannot read: line 2 is not valid UTF-8\n"


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []  # noqa: RUF012 - shared with the test
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": [], "status": 204})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/bill", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_webhook_posts_the_json_summary(
    files: tuple[str, str], hook: tuple[str, type[_Hook]]
) -> None:
    url, handler = hook
    calls, bill = files
    code = run(
        "--calls", calls, "--bill", bill, "-q", "--webhook", url, "--max-duplicate-ratio", "0.02"
    )
    assert code == 3
    [(path, content_type, body)] = handler.received
    assert path == "/hooks/bill"
    assert content_type == "application/json"
    document = json.loads(body)
    assert document["status"] == "alert"
    assert document["alerts"][0]["metric"] == "duplicate_ratio"
    assert document["duplicate_generations"] == 3
    assert document["by_model"]["gpt-4o"]["wasted_cost_usd"] == 0.55


def test_webhook_only_on_alert(files: tuple[str, str], hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    calls, bill = files
    assert (
        run("--calls", calls, "--bill", bill, "-q", "--webhook", url, "--webhook-on", "alert") == 0
    )
    assert handler.received == []


def test_webhook_failure_is_exit_1(
    files: tuple[str, str], hook: tuple[str, type[_Hook]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, handler = hook
    handler.status = 500
    calls, bill = files
    assert run("--calls", calls, "--bill", bill, "-q", "--webhook", url) == 1
    assert "answered 500" in capsys.readouterr().err
