"""The human output of ``payonce simulate``: one small rich table and what to change."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from payonce.reconcile.terminal import usd
from payonce.simulate.report import Figures, Report

__all__ = ["render", "seconds"]


def seconds(value: float) -> str:
    """``4.00 s``, ``26.9 s``, ``312 ms``: three significant digits."""
    if value < 1:
        return f"{value * 1000:#.3g} ms".replace(". ", " ")
    return f"{value:#.3g} s".replace(". ", " ") if value < 100 else f"{value:,.0f} s"


def _percent(ratio: float) -> str:
    # Success rates live near 100%: show enough digits to tell 99.99% from 99.9%.
    if 0.99 < ratio < 1.0:
        return f"{ratio:.3%}"
    return f"{ratio:.2%}"


def _rows(report: Report, result: Figures) -> list[str]:
    return [
        f"{result.billed_per_request:.4f}",
        _percent(result.duplicate_ratio),
        _percent(result.success_rate),
        seconds(result.latency_p50_s),
        seconds(result.latency_p99_s),
        usd(report.wasted_usd_per_million(result)),
        f"{result.attempts_per_request:.3f}",
    ]


_LABELS = (
    "billed per business request",
    "duplicate ratio",
    "success rate",
    "latency p50",
    "latency p99",
    "wasted per 1M requests",
    "SDK attempts per request",
)


def render(report: Report, console: Console) -> None:
    """Print the comparison table, the closed form and the timeout advice."""
    stack = report.stack
    console.print(
        f"[bold]payonce simulate[/bold]: {report.selected.requests:,} business requests,"
        f" {usd(report.price_per_call)} per generation"
    )
    console.print(f"  without payonce: {stack.describe(payonce=False)}", highlight=False)
    console.print(f"  with payonce:    {stack.describe(payonce=True)}", highlight=False)
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("")
    for name, chosen in (("without payonce", not stack.payonce), ("with payonce", stack.payonce)):
        table.add_column(f"{name}{' (chosen)' if chosen else ''}", justify="right")
    columns = zip(
        _LABELS,
        _rows(report, report.without_payonce),
        _rows(report, report.with_payonce),
        strict=True,
    )
    for label, without, with_payonce in columns:
        table.add_row(label, without, with_payonce)
    console.print(table)
    closed = report.closed
    if closed is not None and closed.success_rate is not None:
        console.print(
            f"closed form without payonce: {closed.billed_per_request:.4f} billed per request,"
            f" duplicate ratio {_percent(closed.duplicate_ratio)},"
            f" success rate {_percent(closed.success_rate)}",
            highlight=False,
        )
    console.print(
        f"false timeouts at your {seconds(stack.timeout)} timeout:"
        f" {report.false_timeouts_at_timeout:.2%} of attempts time out and are billed anyway;"
        f" the smallest timeout for at most {report.target_false_timeouts:.2%}:"
        f" [bold]{seconds(report.recommended_timeout_s)}[/bold]"
        + (" (yours is at least that)" if stack.timeout >= report.recommended_timeout_s else ""),
        highlight=False,
    )
    proxy = stack.proxy
    if proxy is not None and proxy.timeout < report.recommended_timeout_s:
        cut = 1.0 - stack.latency.cdf(proxy.timeout)
        console.print(
            f"the proxy's {seconds(proxy.timeout)} timeout abandons {cut:.2%} of its tries"
            " (each still billed): raise it as well, or stop it retrying timeouts",
            highlight=False,
        )
