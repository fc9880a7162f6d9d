"""The terminal summary and the HTML page of a reconciliation against usage reports."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from html import escape

from rich.console import Console
from rich.table import Table
from rich.text import Text

from payonce.reconcile.charts import Series, lines_chart
from payonce.reconcile.html import CSS, card
from payonce.reconcile.html import table as html_table
from payonce.reconcile.report import Alert
from payonce.reconcile.terminal import usd
from payonce.reconcile.usage_report import UsageFigures, UsageReport, UsageSlice

__all__ = ["render_usage", "render_usage_html"]

_BILLED, _LOGGED = "#4c78a8", "#f58518"
_CHART_POINTS = 240  # a year of hourly buckets is drawn as 240 points, each a sum


def _usd(value: Decimal | float | None) -> str:
    return usd(None if value is None else float(value))


def _count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


def _rows(report: UsageReport) -> list[tuple[str, str, str]]:
    t = report.totals
    unexplained = report.unexplained_cost_usd
    return [
        ("Billed requests", _count(t.billed_requests), "the provider's request count"),
        ("Logged upstream calls", f"{t.logged_upstream_calls:,}", "what the gateway sent"),
        (
            "Business requests",
            f"{t.business_requests:,} ({t.successful_business_requests:,} successful)",
            "idempotency keys in the call log",
        ),
        (
            "Duplicate requests",
            f"{t.duplicate_requests:,} ({_ratio(t.duplicate_ratio)})",
            "upstream calls beyond one per business request",
        ),
        ("Wasted on duplicates", _usd(t.wasted_cost_usd), "what the log says they cost"),
        (
            "Unexplained requests",
            _count(t.unexplained_requests),
            "billed, never sent by the gateway",
        ),
        (
            "Unexplained tokens",
            f"{t.unexplained_input_tokens:,} in, {t.unexplained_output_tokens:,} out",
            f"beyond a {report.token_tolerance:.1%} tolerance",
        ),
        ("Unexplained cost", _usd(unexplained), f"by the {report.unexplained_cost_basis}"),
        ("Billed cost", _usd(t.billed_cost_usd), "the report's tokens at list prices"),
        (
            "Cost per successful call",
            _usd(t.cost_per_successful_call_usd),
            "billed cost / successes",
        ),
        ("Flagged buckets", f"{len(report.flagged_buckets):,} of {len(report.buckets):,}", ""),
    ]


def _breakdown(title: str, column: str, slices: Sequence[UsageSlice]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(column, overflow="fold", min_width=12)
    for name in ("billed", "logged", "dups", "unexpl.", "unexpl. tokens", "unexpl. $", "billed $"):
        table.add_column(name, justify="right", no_wrap=True)
    for item in slices:
        f: UsageFigures = item.figures
        table.add_row(
            item.key,
            _count(f.billed_requests),
            f"{f.logged_upstream_calls:,}",
            f"{f.duplicate_requests:,}",
            _count(f.unexplained_requests),
            f"{f.unexplained_tokens:,}",
            _usd(f.unexplained_cost_usd),
            _usd(f.billed_cost_usd),
        )
    return table


def render_usage(
    console: Console, report: UsageReport, alerts: tuple[Alert, ...], *, limit: int = 10
) -> None:
    """Print the comparison, its breakdowns and the most unexplained buckets."""
    if report.period_start and report.period_end:
        console.print(
            "[bold]payonce reconcile[/bold] against usage reports "
            f" {report.period_start:%Y-%m-%d %H:%M} → {report.period_end:%Y-%m-%d %H:%M} UTC"
        )
    summary = Table(title="Reconciliation", show_header=False, title_justify="left")
    summary.add_column("figure", style="bold")
    summary.add_column("value", justify="right")
    summary.add_column("what it means", style="dim")
    for row in _rows(report):
        summary.add_row(*row)
    console.print(summary)
    if report.by_model:
        console.print(_breakdown("By model", "model", report.by_model))
    if report.by_key:
        console.print(_breakdown(f"By {report.key_column}", "key", report.by_key))
    worst = sorted(
        report.flagged_buckets,
        key=lambda s: (-(s.figures.unexplained_requests or 0), -s.figures.unexplained_tokens),
    )[:limit]
    if worst:
        console.print(_breakdown("Flagged buckets (most unexplained first)", "bucket", worst))
    for name, why in report.not_computed.items():
        console.print(Text(f"not computed: {name}: {why}", style="yellow"), soft_wrap=True)
    for reason, count in report.calls_outside.items():
        console.print(
            Text(f"note: {count:,} calls not compared: {reason}", style="yellow"), soft_wrap=True
        )
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"), soft_wrap=True)
    for source in report.inputs:
        if source.note:
            console.print(
                Text(f"note: {source.file}: {source.note}", style="yellow"), soft_wrap=True
            )
    if report.malformed_rows:
        console.print(
            Text(f"{report.malformed_rows:,} malformed rows (first ones):", style="yellow")
        )
        for bad in report.malformed:
            console.print(f"  {bad.file}:{bad.line}: {bad.reason}", markup=False, soft_wrap=True)
    for alert in alerts:
        console.print(Text(f"ALERT: {alert.message}", style="bold red"))


def _gathered(
    buckets: Sequence[UsageSlice], by_requests: bool
) -> tuple[list[str], list[float], list[float]]:
    """At most ``_CHART_POINTS`` points, each the sum of consecutive buckets."""
    step = max(1, -(-len(buckets) // _CHART_POINTS))
    labels, billed, logged = [], [], []
    for start in range(0, len(buckets), step):
        group = buckets[start : start + step]
        labels.append(group[0].key.replace("T", " ").removesuffix(":00Z"))
        if by_requests:
            billed.append(float(sum(s.figures.billed_requests or 0 for s in group)))
            logged.append(float(sum(s.figures.logged_upstream_calls for s in group)))
        else:
            billed.append(
                float(
                    sum(
                        s.figures.billed_input_tokens + s.figures.billed_output_tokens
                        for s in group
                    )
                )
            )
            logged.append(
                float(
                    sum(
                        s.figures.logged_input_tokens + s.figures.logged_output_tokens
                        for s in group
                    )
                )
            )
    return labels, billed, logged


def render_usage_html(
    report: UsageReport, alerts: tuple[Alert, ...], generated: dt.datetime | None = None
) -> str:
    """The whole page as one string: cards, the billed-against-logged chart, the tables."""
    generated = generated or dt.datetime.now(dt.UTC)
    period = (
        f"{report.period_start:%Y-%m-%d %H:%M} to {report.period_end:%Y-%m-%d %H:%M} UTC"
        if report.period_start and report.period_end
        else "period unknown"
    )
    t = report.totals
    flagged = {alert.metric for alert in alerts}
    cards = "".join(
        [
            card(
                "Billed requests", _count(t.billed_requests), f"{t.logged_upstream_calls:,} logged"
            ),
            card(
                "Duplicate requests",
                f"{t.duplicate_requests:,}",
                f"{_ratio(t.duplicate_ratio)} of billed; {_usd(t.wasted_cost_usd)} wasted",
                bad=bool(flagged & {"duplicate_ratio", "duplicate_cost_ratio"}),
            ),
            card(
                "Unexplained cost",
                _usd(report.unexplained_cost_usd),
                f"{_count(t.unexplained_requests)} requests, {t.unexplained_tokens:,} tokens",
                bad="unexplained_cost_usd" in flagged,
            ),
            card("Billed cost", _usd(t.billed_cost_usd), "the report's tokens at list prices"),
            card(
                "Flagged buckets",
                f"{len(report.flagged_buckets):,}",
                f"of {len(report.buckets):,}; tolerance {report.token_tolerance:.1%}",
            ),
        ]
    )
    by_requests = t.billed_requests is not None
    unit = "requests" if by_requests else "tokens"
    labels, billed, logged = _gathered(report.buckets, by_requests)
    chart = lines_chart(
        f"Billed and logged {unit} per bucket",
        labels,
        [Series(f"billed {unit}", billed, _BILLED), Series(f"logged {unit}", logged, _LOGGED)],
        lambda v: f"{v:,.0f}",
    )

    def rows(slices: Sequence[UsageSlice]) -> list[list[str]]:
        return [
            [
                s.key,
                _count(s.figures.billed_requests),
                f"{s.figures.logged_upstream_calls:,}",
                f"{s.figures.duplicate_requests:,}",
                _count(s.figures.unexplained_requests),
                f"{s.figures.unexplained_tokens:,}",
                _usd(s.figures.unexplained_cost_usd),
                _usd(s.figures.billed_cost_usd),
            ]
            for s in slices
        ]

    header = ["", "billed", "logged", "duplicates", "unexplained", "unexplained tokens"]
    header += ["unexplained cost", "billed cost"]
    sections = [f"<h2>By model</h2>{html_table(['model', *header[1:]], rows(report.by_model))}"]
    if report.by_key:
        sections.append(f"<h2>By key</h2>{html_table(['key', *header[1:]], rows(report.by_key))}")
    if report.flagged_buckets:
        sections.append(
            "<h2>Flagged buckets</h2>"
            + html_table(["bucket", *header[1:]], rows(report.flagged_buckets[:200]))
        )
    if report.not_computed:
        sections.append(
            "<h2>Not computed</h2><ul>"
            + "".join(
                f"<li><b>{escape(k)}</b>: {escape(v)}</li>" for k, v in report.not_computed.items()
            )
            + "</ul>"
        )
    inputs = html_table(
        ["file", "side", "format", "rows read", "malformed", "note"],
        [
            [i.file, i.side, i.format, f"{i.rows:,}", f"{i.malformed_rows:,}", i.note]
            for i in report.inputs
        ],
    )
    alert_html = "".join(
        f'<div class="alert"><b>Alert:</b> {escape(a.message)}</div>' for a in alerts
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>LLM usage reconciliation, {escape(period)}</title><style>{CSS}</style></head>"
        f"<body><main><h1>LLM usage reconciliation</h1><p class='sub'>{escape(period)};"
        f" generated {generated:%Y-%m-%d %H:%M} UTC by payonce reconcile</p>"
        f"{alert_html}<div class='cards'>{cards}</div>"
        f"<h2>Billed against logged, per bucket</h2><div class='panel'><p class='muted'>What the"
        f" provider billed ({unit}) and what the gateway's log says it sent, per report bucket"
        " (consecutive buckets summed when there are many). Where the lines part, something"
        " the log does not know used the key.</p>"
        f"{chart}</div>" + "".join(sections) + f"<h2>Inputs</h2>{inputs}</main></body></html>"
    )
