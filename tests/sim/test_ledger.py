"""The ledger: billing, reset, summary shape, and the append-only CSV export."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from payonce.errors import ConfigError
from payonce.sim.ledger import (
    CSV_FIELDS,
    CsvExport,
    Ledger,
    LedgerEntry,
    credential_ids,
    format_timestamp,
)


def entry(request_id: str = "chatcmpl-1", connected: bool = True) -> LedgerEntry:
    return LedgerEntry(
        provider_request_id=request_id,
        model="gpt-4o",
        endpoint="/v1/chat/completions",
        input_tokens=5,
        output_tokens=16,
        cost_usd=0.0001625,
        finished_at=1_700_000_000.25,
        client_connected=connected,
    )


def test_format_timestamp_is_iso_8601_utc() -> None:
    assert format_timestamp(1_700_000_000.25) == "2023-11-14T22:13:20.250Z"


def test_billing_and_summary() -> None:
    ledger = Ledger()
    for _ in range(3):
        ledger.count_request()
    ledger.bill(entry("chatcmpl-1"))
    ledger.bill(entry("chatcmpl-2", connected=False))
    summary = ledger.summary()
    assert summary["billed"] == 2
    assert summary["requests"] == 3
    assert summary["cost_usd"] == pytest.approx(0.000325)
    assert summary["entries"][1] == {
        "provider_request_id": "chatcmpl-2",
        "model": "gpt-4o",
        "endpoint": "/v1/chat/completions",
        "input_tokens": 5,
        "output_tokens": 16,
        "cost_usd": 0.0001625,
        "finished_at": "2023-11-14T22:13:20.250Z",
        "client_connected": False,
        "user": "",
        "api_key_id": "",
        "project_id": "",
    }
    assert ledger.summary(with_entries=False)["entries"] == []


def test_reset() -> None:
    ledger = Ledger()
    ledger.count_request()
    ledger.bill(entry())
    ledger.reset()
    assert ledger.summary() == {
        "billed": 0,
        "cost_usd": 0.0,
        "requests": 0,
        "generating": 0,
        "entries": [],
    }


def read_rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as file:
        return list(csv.reader(file))


def test_csv_header_once_rows_appended_and_kept_across_reset(tmp_path: Path) -> None:
    path = tmp_path / "bill.csv"
    ledger = Ledger(CsvExport(path))
    ledger.bill(entry("chatcmpl-1"))
    ledger.reset()
    ledger.bill(entry("chatcmpl-2", connected=False))
    assert ledger.export is not None
    ledger.export.close()

    reopened = CsvExport(path)  # an existing file gets no second header
    reopened.write(entry("chatcmpl-3"))
    reopened.close()

    rows = read_rows(path)
    assert rows[0] == list(CSV_FIELDS)
    assert [row[0] for row in rows[1:]] == ["chatcmpl-1", "chatcmpl-2", "chatcmpl-3"]
    assert rows[2] == [
        "chatcmpl-2",
        "gpt-4o",
        "/v1/chat/completions",
        "5",
        "16",
        "0.0001625",
        "2023-11-14T22:13:20.250Z",
        "false",
        "",
        "",
        "",
    ]


def test_csv_rows_are_buffered_until_flush(tmp_path: Path) -> None:
    path = tmp_path / "bill.csv"
    export = CsvExport(path)
    export.flush()
    export.write(entry())
    assert len(read_rows(path)) == 1, "one buffered row must not hit the disk on its own"
    export.flush()
    assert len(read_rows(path)) == 2
    export.close()
    export.close()  # closing twice is harmless


def test_csv_that_cannot_be_opened_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--ledger: cannot open"):
        CsvExport(tmp_path / "no" / "such" / "dir.csv")


def test_credential_ids_are_stable_hashes_that_never_hold_the_credential() -> None:
    openai = credential_ids("sk-test-one", anthropic=False)
    assert openai == credential_ids("sk-test-one", anthropic=False)
    assert openai != credential_ids("sk-test-two", anthropic=False)
    key_id, project = openai
    assert key_id.startswith("key_") and len(key_id) == 16
    assert project.startswith("proj_") and len(project) == 17
    key_id, workspace = credential_ids("sk-ant-test", anthropic=True)
    assert key_id.startswith("apikey_") and workspace.startswith("wrkspc_")
    assert "test" not in key_id + workspace
