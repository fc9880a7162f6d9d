"""The small parts: column maps, format detection, money formatting, chart axes, progress."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from payonce.errors import ConfigError
from payonce.reconcile.charts import nice_ceiling
from payonce.reconcile.run import reconcile
from payonce.reconcile.schema import Side, parse_column_map
from payonce.reconcile.sniff import Container, detect_format, sniff
from payonce.reconcile.terminal import BarProgress, usd
from tests.reconcile import data


def test_column_maps() -> None:
    assert parse_column_map("business_id=order_id, tag=team", Side.CALLS) == {
        "business_id": "order_id",
        "tag": "team",
    }
    assert parse_column_map(None, Side.BILL) == {}
    for text, needle in [
        ("business_id", "FIELD=COLUMN"),
        ("price=x", "unknown field 'price'"),
        ("tag=a,tag=b", "mapped twice"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            parse_column_map(text, Side.CALLS)


def test_detection(tmp_path: Path) -> None:
    cases = [
        (data.payonce_calls(tmp_path), Side.CALLS, "payonce", Container.JSONL),
        (data.payonce_calls(tmp_path, zipped=True), Side.CALLS, "payonce", Container.JSONL),
        (data.generic_calls_csv(tmp_path), Side.CALLS, "generic", Container.CSV),
        (data.ledger_csv(tmp_path), Side.BILL, "ledger", Container.CSV),
        (data.litellm_csv(tmp_path), Side.BILL, "litellm", Container.CSV),
        (data.litellm_json(tmp_path), Side.BILL, "litellm", Container.JSON),
        (data.generic_bill_jsonl(tmp_path), Side.BILL, "generic", Container.JSONL),
    ]
    for path, side, name, container in cases:
        sniffed = sniff(path)
        assert (detect_format(sniffed, side, None).name, sniffed.container) == (name, container)
    tabs = tmp_path / "tabs.tsv"
    tabs.write_text("provider_request_id\tcost_usd\nr1\t0.1\n")
    assert sniff(tabs).delimiter == "\t"
    empty = tmp_path / "empty.csv"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match="empty file"):
        sniff(empty)
    with pytest.raises(ConfigError, match="unknown format"):
        detect_format(sniff(tabs), Side.BILL, "stripe")


def test_a_data_envelope_is_read(tmp_path: Path) -> None:
    path = tmp_path / "spend.json"
    path.write_text('{"data": [{"request_id": "r1", "spend": 0.5, "startTime": "2026-11-30"}]}')
    sniffed = sniff(path)
    assert sniffed.container is Container.JSON
    assert detect_format(sniffed, Side.BILL, None).name == "litellm"
    report = reconcile([data.generic_calls_csv(tmp_path)], [path])
    assert report.totals.matched_generations == 1
    assert float(report.totals.total_cost_usd) == 0.5


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "—"),
        (0, "$0.00"),
        (2.55, "$2.55"),
        (1234.5, "$1,234.50"),
        (0.7, "$0.70"),
        (0.51, "$0.51"),
        (0.4666666667, "$0.4667"),
        (0.000066, "$0.000066"),
        (-0.2, "-$0.20"),
    ],
)
def test_usd(value: float | None, text: str) -> None:
    assert usd(value) == text


@pytest.mark.parametrize(
    ("value", "top"), [(0, 1), (0.51, 1), (1.5, 2), (2.2, 2.5), (3, 5), (7, 10), (0.003, 0.005)]
)
def test_axis_tops(value: float, top: float) -> None:
    assert nice_ceiling(value) == pytest.approx(top)


def test_progress_bar_follows_the_poll() -> None:
    polled: list[float] = []

    def poll() -> float:
        value = min(100.0, len(polled) * 25.0)
        polled.append(value)
        return value

    out = io.StringIO()
    bar = BarProgress(Console(file=out, force_terminal=True, width=80))
    with bar.track("reading calls.jsonl", poll):
        deadline = time.monotonic() + 10
        while len(polled) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(polled) >= 2
    assert "reading calls.jsonl" in out.getvalue()
