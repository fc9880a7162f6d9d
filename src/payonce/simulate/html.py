"""The ``--html`` page: the figures and two charts against the client timeout.

One self-contained file (inline CSS and SVG from :mod:`payonce.simulate.chart`):
it loads nothing from the network and runs no script.
"""

from __future__ import annotations

from html import escape

from payonce.reconcile.terminal import usd
from payonce.simulate.chart import Line, Marker, timeout_chart
from payonce.simulate.report import Figures, Report
from payonce.simulate.sweep import Sweep
from payonce.simulate.terminal import seconds

__all__ = ["render_html"]

_WITHOUT, _WITH, _TIMEOUT, _RECOMMENDED = "#e45756", "#4c78a8", "#1d232a", "#2e8b57"

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;
background:#f6f7f9;color:#1d232a}
main{max-width:960px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}
.sub{color:#5b6570;margin:0 0 16px;font-size:14px}
.panel{background:#fff;border-radius:8px;padding:12px 16px;box-shadow:0 1px 2px #0001;
margin-bottom:12px}
table{border-collapse:collapse;width:100%;font-size:14px;background:#fff}
th,td{padding:6px 8px;border-bottom:1px solid #e6e8eb;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f0f2f4}
code{font-size:13px}.muted{color:#5b6570;font-size:13px}
"""


def _percent(value: float) -> str:
    return f"{value:.1%}" if value < 0.99 or value == 1 else f"{value:.2%}"


def _cells(report: Report, result: Figures) -> list[str]:
    return [
        f"{result.billed_per_request:.4f}",
        f"{result.duplicate_ratio:.2%}",
        f"{result.success_rate:.3%}",
        seconds(result.latency_p50_s),
        seconds(result.latency_p99_s),
        usd(report.wasted_usd_per_million(result)),
    ]


_ROWS = (
    "billed generations per business request",
    "duplicate ratio",
    "success rate",
    "user latency p50",
    "user latency p99",
    "wasted per million business requests",
)


def _table(report: Report) -> str:
    rows = zip(
        _ROWS,
        _cells(report, report.without_payonce),
        _cells(report, report.with_payonce),
        strict=True,
    )
    body = "".join(
        f"<tr><td>{escape(label)}</td><td>{escape(a)}</td><td>{escape(b)}</td></tr>"
        for label, a, b in rows
    )
    return f"<table><tr><th></th><th>without payonce</th><th>with payonce</th></tr>{body}</table>"


def render_html(report: Report, sweep: Sweep) -> str:
    """The whole page for ``report`` and the timeout ``sweep`` of the same stack."""
    stack = report.stack
    timeouts = [point.timeout for point in sweep.points]
    markers = [
        Marker(f"your timeout {seconds(sweep.timeout)}", sweep.timeout, _TIMEOUT),
        Marker(f"recommended {seconds(sweep.recommended)}", sweep.recommended, _RECOMMENDED),
    ]
    duplicates = timeout_chart(
        "Duplicate ratio against the client timeout",
        timeouts,
        [
            Line(
                "without payonce",
                [p.without_payonce.duplicate_ratio for p in sweep.points],
                _WITHOUT,
            ),
            Line(
                "with payonce",
                [p.with_payonce.duplicate_ratio for p in sweep.points],
                _WITH,
                dashed=True,
            ),
        ],
        markers,
        _percent,
    )
    success = timeout_chart(
        "Success rate against the client timeout",
        timeouts,
        [
            Line(
                "without payonce", [p.without_payonce.success_rate for p in sweep.points], _WITHOUT
            ),
            Line(
                "with payonce",
                [p.with_payonce.success_rate for p in sweep.points],
                _WITH,
                dashed=True,
            ),
        ],
        markers,
        _percent,
        zoom=True,
    )
    closed = ""
    if report.closed is not None and report.closed.success_rate is not None:
        closed = (
            f"<p class=muted>Closed form without payonce: {report.closed.billed_per_request:.4f}"
            f" billed per request, duplicate ratio {report.closed.duplicate_ratio:.2%}.</p>"
        )
    per_point = sweep.points[0].without_payonce.requests
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>payonce simulate</title><style>{_CSS}</style></head>
<body><main>
<h1>What this timeout and retry configuration costs</h1>
<p class=sub>{report.selected.requests:,} simulated business requests,
{escape(usd(report.price_per_call))} per generation.<br>
Without payonce: <code>{escape(stack.describe(payonce=False))}</code><br>
With payonce: <code>{escape(stack.describe(payonce=True))}</code></p>
<div class=panel>{_table(report)}{closed}
<p class=muted>At your {escape(seconds(stack.timeout))} timeout
{report.false_timeouts_at_timeout:.2%} of attempts time out although the provider
goes on to finish and bill them (false timeouts). The smallest timeout that keeps them
at or below {report.target_false_timeouts:.2%} is
<b>{escape(seconds(report.recommended_timeout_s))}</b>.</p></div>
<h2>Duplicate ratio against the client timeout</h2>
<div class=panel>{duplicates}</div>
<h2>Success rate against the client timeout</h2>
<div class=panel>{success}</div>
<h2>How to read this</h2>
<div class=panel><p>Each point is the same stack with only the SDK's client timeout
changed ({per_point:,} simulated business requests per point, the same random draws for
every point). The black dashed line is where your configuration sits, the green one the
recommended timeout. Left of it, retries re-send requests the provider was about to
answer: without payonce each one is billed again (the red line climbs); with payonce
(blue, dashed) a retry joins the generation already running, so the duplicates that
remain come only from retrying layers below the gateway. With payonce every retry
waits for the same generation, so a business request succeeds when that generation
ends before the last attempt gives up: at short timeouts this succeeds far more often
than re-sending (each re-sent attempt must itself be fast), while at long ones it can be
slightly lower, because a retry cannot re-roll a generation stuck in the tail.
The model and its assumptions: <code>docs/simulate.md</code>.</p></div>
</main></body></html>
"""
