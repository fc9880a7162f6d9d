"""The body of ``payonce reconcile`` once its flags are parsed (imports DuckDB and rich)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from payonce.errors import ConfigError
from payonce.reconcile.alerts import (
    ALERT_EXIT_CODE,
    Thresholds,
    check_webhook_url,
    evaluate,
    post_webhook,
)
from payonce.reconcile.analysis import AnalysisSettings
from payonce.reconcile.cli import now, parse_threshold, write_json
from payonce.reconcile.engine import EngineSettings
from payonce.reconcile.fetch import (
    DEFAULT_BASE_URLS,
    admin_key_from_env,
    fetch_reports,
    parse_moment,
)
from payonce.reconcile.html import render_html
from payonce.reconcile.keymap import read_key_map
from payonce.reconcile.run import ReconcileOptions, reconcile
from payonce.reconcile.schema import Side, parse_column_map
from payonce.reconcile.terminal import BarProgress, render
from payonce.reconcile.usage_report import UsageReport
from payonce.reconcile.usage_views import render_usage, render_usage_html

__all__ = ["run_command"]

_PROGRESS_FROM_BYTES = 64 << 20


def _input_bytes(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            continue  # reported by the reader, with a proper message
    return total


def _options(flags: dict[str, Any], temp_dir: Path) -> ReconcileOptions:
    factor = parse_threshold("--outlier-factor", flags["outlier_factor"])
    if factor is None or factor <= 1:
        raise ConfigError("--outlier-factor: must be above 1")
    return ReconcileOptions(
        calls_format=None if flags["calls_format"] == "auto" else flags["calls_format"],
        bill_format=None if flags["bill_format"] == "auto" else flags["bill_format"],
        calls_map=parse_column_map(flags["calls_map"], Side.CALLS),
        bill_map=parse_column_map(flags["bill_map"], Side.BILL),
        engine=EngineSettings(
            memory_limit=flags["memory_limit"],
            temp_directory=temp_dir,
            threads=flags["threads"],
        ),
        analysis=AnalysisSettings(outlier_factor=factor),
        key_map=read_key_map(flags["key_map"]) if flags["key_map"] else None,
        token_tolerance=_tolerance(flags["token_tolerance"]),
    )


def _tolerance(value: str) -> float:
    tolerance = parse_threshold("--token-tolerance", value)
    if tolerance is None or tolerance >= 1:
        raise ConfigError("--token-tolerance: expected a share below 1 (0.01 = 1%)")
    return tolerance


_FETCH_ONLY_FLAGS = (
    ("--since", "since"),
    ("--until", "until"),
    ("--fetch-url", "fetch_url"),
    ("--bucket-width", "bucket_width"),
    ("--save", "save"),
)


def _pages(path: Path) -> str:
    count = path.read_bytes().count(b"\n")
    return f"{count} page" if count == 1 else f"{count} pages"


def _fetched_bills(flags: dict[str, Any], scratch: Path) -> list[Path]:
    """``--fetch``: the provider's reports, in ``--save DIR`` or ``scratch``; [] without it."""
    provider = flags["fetch"]
    if provider is None:
        for flag, name in _FETCH_ONLY_FLAGS:
            if flags[name] is not None:
                raise ConfigError(f"{flag} needs --fetch openai|anthropic")
        if not flags["bills"]:
            raise ConfigError("--bill: at least one bill is needed (or --fetch openai|anthropic)")
        return []
    if flags["since"] is None:
        raise ConfigError("--since is required with --fetch (an ISO date or time, UTC)")
    if flags["bill_format"] != "auto":
        # It would apply to the fetched reports too, whose kind is known.
        raise ConfigError("--bill-format: not with --fetch (fetched reports are recognised)")
    since = parse_moment("--since", flags["since"])
    until = parse_moment("--until", flags["until"]) if flags["until"] else now()
    directory = flags["save"] or scratch
    paths = fetch_reports(
        provider,
        since,
        until,
        base_url=flags["fetch_url"] or DEFAULT_BASE_URLS[provider],
        admin_key=admin_key_from_env(provider),
        directory=directory,
        bucket_width=flags["bucket_width"] or "1h",
    )
    if not flags["quiet"]:
        counts = ", ".join(f"{path.name} ({_pages(path)})" for path in paths)
        where = f" into {directory}" if flags["save"] else ""
        click.echo(f"payonce: fetched {counts}{where}", err=True)
    return paths


def run_command(flags: dict[str, Any]) -> int:
    """Run one reconciliation; the exit code (0, or 3 when a threshold is exceeded)."""
    thresholds = Thresholds(
        max_duplicate_ratio=parse_threshold("--max-duplicate-ratio", flags["max_duplicate_ratio"]),
        max_cost_per_call=parse_threshold("--max-cost-per-call", flags["max_cost_per_call"]),
        max_unexplained_cost=parse_threshold(
            "--max-unexplained-cost", flags["max_unexplained_cost"]
        ),
    )
    webhook = check_webhook_url(flags["webhook"]) if flags["webhook"] else None
    calls, bills = list(flags["calls"]), list(flags["bills"])
    # The summary goes to stderr when the JSON goes to stdout, so pipes stay clean.
    console = Console(stderr=flags["json_path"] == "-", highlight=False)
    stderr = Console(stderr=True)
    show_progress = flags["progress"]
    if show_progress is None:
        show_progress = stderr.is_terminal and _input_bytes(calls + bills) >= _PROGRESS_FROM_BYTES
    progress = BarProgress(stderr) if show_progress else None

    with tempfile.TemporaryDirectory(prefix="payonce-reconcile-", dir=flags["temp_dir"]) as temp:
        bills += _fetched_bills(flags, Path(temp) / "fetched")
        report = reconcile(calls, bills, _options(flags, Path(temp)), progress)
    alerts = evaluate(report, thresholds)
    document = report.as_json(alerts)

    if not flags["quiet"]:
        if isinstance(report, UsageReport):
            render_usage(console, report, alerts)
        else:
            render(console, report, alerts)
    elif alerts:
        for alert in alerts:
            stderr.print(f"[bold red]ALERT:[/bold red] {alert.message}")
    if flags["json_path"]:
        write_json(flags["json_path"], document)
    if flags["html_path"]:
        try:
            page = (
                render_usage_html(report, alerts, now())
                if isinstance(report, UsageReport)
                else render_html(report, alerts, now())
            )
            flags["html_path"].write_text(page, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--html: cannot write {flags['html_path']}: {exc.strerror}") from exc
    if webhook and (alerts or flags["webhook_on"] == "always"):
        post_webhook(webhook, document)
    if alerts:
        sys.stderr.flush()
        return ALERT_EXIT_CODE
    return 0
