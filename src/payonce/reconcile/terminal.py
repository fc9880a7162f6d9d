"""The terminal summary (rich tables) and the progress bar shown on large inputs."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from payonce.reconcile.report import Alert, Figures, Report, Slice

__all__ = ["BarProgress", "percent", "render", "usd"]


def usd(value: float | None) -> str:
    """Dollars for people: cents above a dollar, four significant digits below."""
    if value is None:
        return "—"
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value >= 1 or value == 0:
        return f"{sign}${value:,.2f}"
    digits = max(2, 3 - math.floor(math.log10(value)))
    whole, _, decimals = f"{value:.{digits}f}".rstrip("0").partition(".")
    return f"{sign}${whole}.{decimals.ljust(2, '0')}"


def percent(ratio: float) -> str:
    return f"{ratio:.2%}"


def _float(value: object) -> float:
    return float(value)  # type: ignore[arg-type]


def _summary(report: Report) -> Table:
    totals = report.totals
    table = Table(title="Reconciliation", show_header=False, title_justify="left")
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    table.add_column("what it means", style="dim")
    rows = [
        ("Billed generations", f"{totals.billed_generations:,}", "request ids on the bill"),
        (
            "Business requests",
            f"{totals.business_requests:,} ({totals.successful_business_requests:,} successful)",
            "business ids in the call log",
        ),
        (
            "Duplicate generations",
            f"{totals.duplicate_generations:,} ({percent(totals.duplicate_ratio)})",
            "billed again for a business request already billed",
        ),
        ("Wasted on duplicates", usd(_float(totals.wasted_cost_usd)), "lower bound"),
        ("Total spend", usd(_float(totals.total_cost_usd)), "everything on the bill"),
        (
            "Cost per successful call",
            usd(totals.cost_per_successful_call_usd),
            "total spend / successful business requests",
        ),
        (
            "Unmatched bill lines",
            f"{totals.unmatched_bill_lines:,} ({usd(_float(totals.unmatched_cost_usd))})",
            "spend no call explains",
        ),
        (
            "Outliers",
            f"{report.outliers.count:,} ({usd(_float(report.outliers.cost_usd))})",
            f"above {report.outliers.factor:g}x their model's median",
        ),
        ("Unbilled calls", f"{report.unbilled_calls:,}", "request ids the bill does not show"),
        ("Malformed rows", f"{report.malformed_rows:,}", "not counted anywhere above"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def _breakdown(title: str, column: str, slices: tuple[Slice, ...]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(column, overflow="fold", min_width=12)
    for name in ("gens", "dups", "dup %", "wasted", "spend", "unmatched", "$/success"):
        table.add_column(name, justify="right", no_wrap=True)
    for item in slices:
        f: Figures = item.figures
        table.add_row(
            item.label,
            f"{f.billed_generations:,}",
            f"{f.duplicate_generations:,}",
            percent(f.duplicate_ratio),
            usd(_float(f.wasted_cost_usd)),
            usd(_float(f.total_cost_usd)),
            usd(_float(f.unmatched_cost_usd)),
            usd(f.cost_per_successful_call_usd),
        )
    return table


def _outliers(report: Report, limit: int) -> Table:
    table = Table(
        title=f"Outliers: {report.outliers.count:,} generations above"
        f" {report.outliers.factor:g}x their model's median",
        title_justify="left",
    )
    for name in ("request id", "model", "cost", "median", "x", "business id"):
        table.add_column(name, justify="right" if name in ("cost", "median", "x") else "left")
    for outlier in report.outliers.top[:limit]:
        table.add_row(
            outlier.provider_request_id or "—",
            outlier.model,
            usd(_float(outlier.cost_usd)),
            usd(_float(outlier.model_median_usd)),
            f"{outlier.ratio:.1f}",
            outlier.business_id or "—",
        )
    return table


def _unmatched(report: Report, limit: int) -> Table:
    table = Table(title="Largest unmatched bill lines", title_justify="left")
    for name in ("request id", "model", "cost", "lines", "file"):
        table.add_column(name, justify="right" if name in ("cost", "lines") else "left")
    for item in report.unmatched[:limit]:
        table.add_row(
            item.provider_request_id or "(no request id)",
            item.model or "—",
            usd(_float(item.cost_usd)),
            str(item.lines),
            item.file,
        )
    return table


def render(console: Console, report: Report, alerts: tuple[Alert, ...], *, limit: int = 10) -> None:
    """Print the summary, the breakdowns, and what needs a look."""
    if report.period_start and report.period_end:
        console.print(
            f"[bold]payonce reconcile[/bold]  {report.period_start:%Y-%m-%d %H:%M} →"
            f" {report.period_end:%Y-%m-%d %H:%M} UTC"
        )
    console.print(_summary(report))
    console.print(_breakdown("By model", "model", report.by_model))
    if len(report.by_endpoint) > 1:
        console.print(_breakdown("By endpoint", "endpoint", report.by_endpoint))
    if any(item.key is not None for item in report.by_tag):
        console.print(_breakdown("By tag", "tag", report.by_tag))
    stated = report.stated_costs
    if stated.calls:
        console.print(
            f"Stated costs: {stated.calls:,} calls priced by the provider's own cost,"
            f" {usd(_float(stated.stated_cost_usd))}; the {stated.calls_with_list_price:,}"
            f" with a list price: {usd(_float(stated.compared_stated_cost_usd))} stated,"
            f" {usd(_float(stated.list_cost_usd))} listed"
            f" (difference {usd(_float(stated.difference_usd))})"
        )
    if report.spans_days:
        console.print(_breakdown("Daily", "day (UTC)", report.daily))
    if report.outliers.count:
        console.print(_outliers(report, limit))
    if report.unmatched:
        console.print(_unmatched(report, limit))
    if report.malformed_rows:
        console.print(
            Text(f"{report.malformed_rows:,} malformed rows (first ones):", style="bold yellow")
        )
        for row in report.malformed:
            console.print(
                f"  {row.file}:{row.line}: {row.reason}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    for source in report.inputs:
        if source.note:
            console.print(
                Text(f"note: {source.file}: {source.note}", style="yellow"), soft_wrap=True
            )
    for alert in alerts:
        console.print(Text(f"ALERT: {alert.message}", style="bold red"))


class BarProgress:
    """A rich progress bar for each long statement, fed by DuckDB's own progress."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )

    @contextlib.contextmanager
    def track(self, label: str, poll: Callable[[], float]) -> Iterator[None]:
        task = self._progress.add_task(label, total=100)
        stop = threading.Event()

        def update() -> None:
            while not stop.wait(0.1):
                value = poll()
                if value >= 0:
                    self._progress.update(task, completed=value)

        watcher = threading.Thread(target=update, name="reconcile-progress", daemon=True)
        self._progress.start()
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
            self._progress.update(task, completed=100)
            self._progress.remove_task(task)
            self._progress.stop()
