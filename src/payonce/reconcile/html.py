"""The ``--html`` report: one self-contained page for a finance reader.

Everything is inline (CSS, SVG charts drawn by :mod:`payonce.reconcile.charts`);
the page loads nothing from the network and runs no script.
"""

from __future__ import annotations

import datetime as dt
from html import escape

from payonce.reconcile.charts import Series, horizontal_bars, line_chart, stacked_bars
from payonce.reconcile.report import Alert, Figures, Report, Slice, StatedCosts
from payonce.reconcile.terminal import percent, usd

__all__ = ["render_html"]

_NEEDED, _WASTED, _UNMATCHED, _RATIO, _PER_CALL = (
    "#4c78a8",
    "#e45756",
    "#b0b7bf",
    "#f58518",
    "#54a24b",
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;
background:#f6f7f9;color:#1d232a}
main{max-width:1080px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px}
.sub{color:#5b6570;margin:0 0 20px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(190px,1fr));gap:12px}
.card{background:#fff;border-radius:8px;padding:14px 16px;box-shadow:0 1px 2px #0001}
.card .v{font-size:24px;font-weight:600;margin:4px 0}.card .k{color:#5b6570;font-size:13px}
.card.bad{border-left:4px solid #e45756}
.alert{background:#fdecea;border:1px solid #e45756;border-radius:8px;
padding:10px 14px;margin:16px 0}
.panel{background:#fff;border-radius:8px;padding:12px 16px;box-shadow:0 1px 2px #0001;
margin-bottom:12px}
table{border-collapse:collapse;width:100%;font-size:13px;background:#fff}
th,td{padding:6px 8px;border-bottom:1px solid #e6e8eb;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f0f2f4}
dl{display:grid;grid-template-columns:max-content 1fr;gap:6px 16px;font-size:14px}
dt{font-weight:600}dd{margin:0}.muted{color:#5b6570;font-size:13px}
"""

_DEFINITIONS = (
    (
        "Billed generation",
        "One request id on the provider's bill: one time the model ran and"
        " was paid for (several bill lines with the same id are added up).",
    ),
    (
        "Business request",
        "One thing your application asked for (one idempotency key or"
        " business id), however many times it was retried.",
    ),
    (
        "Duplicate",
        "When a business request was billed k times, k - 1 of those are duplicates:"
        " every generation except the cheapest one.",
    ),
    (
        "Wasted",
        "What the duplicates cost. A lower bound: the cheapest run is always counted"
        " as the one that was needed.",
    ),
    (
        "Cost per successful call",
        "Total spend divided by the business requests that"
        " eventually succeeded: what one useful answer really costs.",
    ),
    (
        "Unmatched spend",
        "Bill lines whose request id appears in no call log: spend that"
        " nothing here explains (another application, or calls that were never logged).",
    ),
    ("Outlier", "A generation that cost far more than its model's usual (median) cost."),
)


def _usd(value: object) -> str:
    return usd(float(value))  # type: ignore[arg-type]


def card(title: str, value: str, note: str, *, bad: bool = False) -> str:
    return (
        f'<div class="card{" bad" if bad else ""}"><div class="k">{escape(title)}</div>'
        f'<div class="v">{escape(value)}</div><div class="k">{escape(note)}</div></div>'
    )


def _column_note(column: str | None) -> str:
    if column is None:
        return ""
    return f"<p class='muted'>From the call log's <code>{escape(column)}</code>.</p>"


def _stated_costs(stated: StatedCosts) -> str:
    """The calls the provider priced itself, beside their list price."""
    unlisted = stated.calls - stated.calls_with_list_price
    note = (
        f" {unlisted:,} of them have no list price and are left out of the comparison."
        if unlisted
        else ""
    )
    return (
        "<h2>Stated costs</h2><p class='muted'>Calls priced by the cost the provider"
        " stated in its response (OpenRouter's <code>usage.cost</code>), and the same"
        f" calls at their list price (<code>--prices</code>, genai-prices).{note}</p>"
        + table(
            ["calls", "stated", "with a list price", "their stated cost", "list price",
             "stated - list"],
            [
                [
                    f"{stated.calls:,}",
                    _usd(stated.stated_cost_usd),
                    f"{stated.calls_with_list_price:,}",
                    _usd(stated.compared_stated_cost_usd),
                    _usd(stated.list_cost_usd),
                    _usd(stated.difference_usd),
                ]
            ],
        )
    )  # fmt: skip


def table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _breakdown(column: str, slices: tuple[Slice, ...]) -> str:
    rows = []
    for item in slices:
        f: Figures = item.figures
        rows.append(
            [
                item.label,
                f"{f.billed_generations:,}",
                f"{f.duplicate_generations:,}",
                percent(f.duplicate_ratio),
                _usd(f.wasted_cost_usd),
                _usd(f.total_cost_usd),
                _usd(f.unmatched_cost_usd),
                f"{f.successful_business_requests:,}",
                usd(f.cost_per_successful_call_usd),
            ]
        )
    header = [
        column,
        "generations",
        "duplicates",
        "duplicate ratio",
        "wasted",
        "spend",
        "unmatched",
        "successful requests",
        "cost per success",
    ]
    return table(header, rows)


def _charts(report: Report) -> str:
    days = report.daily or ()
    parts = []
    if days:
        labels = [item.label for item in days]
        needed = [
            float(
                d.figures.total_cost_usd - d.figures.wasted_cost_usd - d.figures.unmatched_cost_usd
            )
            for d in days
        ]
        parts.append(
            '<h2>Spend and waste per day</h2><div class="panel"><p class="muted">What was'
            " paid each day (UTC): the generations that were needed, those billed again for"
            " the same business request, and bill lines no call explains.</p>"
        )
        parts.append(
            stacked_bars(
                "Spend per day, split into needed, wasted on duplicates and unmatched",
                labels,
                [
                    Series("needed", [max(v, 0.0) for v in needed], _NEEDED),
                    Series(
                        "wasted on duplicates",
                        [float(d.figures.wasted_cost_usd) for d in days],
                        _WASTED,
                    ),
                    Series(
                        "unmatched", [float(d.figures.unmatched_cost_usd) for d in days], _UNMATCHED
                    ),
                ],
                usd,
            )
        )
        parts.append("</div>")
    models = [item for item in report.by_model if item.figures.billed_generations]
    parts.append(
        '<h2>Duplicate ratio by model</h2><div class="panel"><p class="muted">Share of'
        " each model's billed generations that were duplicates.</p>"
    )
    parts.append(
        horizontal_bars(
            "Share of billed generations that were duplicates, by model",
            [(item.label, item.figures.duplicate_ratio) for item in models],
            _RATIO,
            percent,
        )
    )
    parts.append("</div><h2>Cost per successful call</h2>")
    if report.spans_days:
        parts.append(
            '<div class="panel"><p class="muted">Per day: spend that day divided by'
            " the business requests first seen that day that succeeded.</p>"
        )
        parts.append(
            line_chart(
                "Cost per successful business call, per day",
                [item.label for item in days],
                [item.figures.cost_per_successful_call_usd for item in days],
                _PER_CALL,
                usd,
            )
        )
        parts.append("</div>")
    per_model = [
        (item.label, item.figures.cost_per_successful_call_usd)
        for item in report.by_model
        if item.figures.cost_per_successful_call_usd is not None
    ]
    parts.append(
        '<div class="panel"><p class="muted">By model: what one successful business'
        " request cost, duplicates included.</p>"
    )
    parts.append(
        horizontal_bars(
            "Cost per successful business call, by model",
            [(label, value) for label, value in per_model if value is not None],
            _PER_CALL,
            usd,
        )
    )
    parts.append("</div>")
    return "".join(parts)


def render_html(
    report: Report, alerts: tuple[Alert, ...], generated: dt.datetime | None = None
) -> str:
    """The whole page as one string."""
    generated = generated or dt.datetime.now(dt.UTC)
    totals = report.totals
    period = (
        f"{report.period_start:%Y-%m-%d %H:%M} to {report.period_end:%Y-%m-%d %H:%M} UTC"
        if report.period_start and report.period_end
        else "period unknown (no timestamps)"
    )
    flagged = {alert.metric for alert in alerts}
    share = float(totals.wasted_cost_usd / totals.total_cost_usd) if totals.total_cost_usd else 0.0
    cards = "".join(
        [
            card(
                "Total spend",
                _usd(totals.total_cost_usd),
                f"{totals.billed_generations:,} billed generations",
            ),
            card(
                "Wasted on duplicates", _usd(totals.wasted_cost_usd), f"{percent(share)} of spend"
            ),
            card(
                "Duplicate ratio",
                percent(totals.duplicate_ratio),
                f"{totals.duplicate_generations:,} duplicate generations",
                bad="duplicate_ratio" in flagged,
            ),
            card(
                "Cost per successful call",
                usd(totals.cost_per_successful_call_usd),
                f"{totals.successful_business_requests:,} successful business requests",
                bad="cost_per_successful_call_usd" in flagged,
            ),
            card(
                "Unmatched spend",
                _usd(totals.unmatched_cost_usd),
                f"{totals.unmatched_bill_lines:,} bill"
                f" line{'' if totals.unmatched_bill_lines == 1 else 's'} no call explains",
            ),
        ]
    )
    alert_html = "".join(
        f'<div class="alert"><b>Alert:</b> {escape(a.message)}</div>' for a in alerts
    )
    definitions = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in _DEFINITIONS)
    sections = [
        f"<h2>By model</h2>{_breakdown('model', report.by_model)}",
    ]
    if len(report.by_endpoint) > 1:
        sections.append(
            f"<h2>By endpoint</h2>{_column_note(report.endpoint_column)}"
            f"{_breakdown('endpoint', report.by_endpoint)}"
        )
    if any(item.key is not None for item in report.by_tag):
        sections.append(
            f"<h2>By tag</h2>{_column_note(report.tag_column)}{_breakdown('tag', report.by_tag)}"
        )
    if report.stated_costs.calls:
        sections.append(_stated_costs(report.stated_costs))
    if report.daily:
        sections.append(f"<h2>Daily</h2>{_breakdown('day (UTC)', report.daily)}")
    outliers = report.outliers
    sections.append(
        f"<h2>Outliers</h2><p class='muted'>{outliers.count:,} generations cost more than"
        f" {outliers.factor:g}x their model's median ({_usd(outliers.cost_usd)} in all,"
        f" {_usd(outliers.excess_cost_usd)} above the median).</p>"
    )
    if outliers.top:
        sections.append(
            table(
                ["request id", "model", "cost", "model median", "x median", "business id"],
                [
                    [
                        o.provider_request_id or "—",
                        o.model,
                        _usd(o.cost_usd),
                        _usd(o.model_median_usd),
                        f"{o.ratio:.1f}",
                        o.business_id or "—",
                    ]
                    for o in outliers.top
                ],
            )
        )
    if report.unmatched:
        sections.append("<h2>Largest unmatched bill lines</h2>")
        sections.append(
            table(
                ["request id", "model", "cost", "bill lines", "file"],
                [
                    [
                        u.provider_request_id or "(none)",
                        u.model or "—",
                        _usd(u.cost_usd),
                        str(u.lines),
                        u.file,
                    ]
                    for u in report.unmatched
                ],
            )
        )
    if report.malformed_rows:
        sections.append(
            f"<h2>Malformed rows</h2><p class='muted'>{report.malformed_rows:,} rows could not be"
            " read and are not counted above. The first ones:</p>"
        )
        sections.append(
            table(
                ["file", "line", "reason"],
                [[m.file, str(m.line), m.reason] for m in report.malformed],
            )
        )
    inputs = table(
        ["file", "side", "format", "rows read", "malformed"],
        [[i.file, i.side, i.format, f"{i.rows:,}", f"{i.malformed_rows:,}"] for i in report.inputs],
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>LLM bill reconciliation, {escape(period)}</title><style>{CSS}</style></head>"
        f"<body><main><h1>LLM bill reconciliation</h1><p class='sub'>{escape(period)};"
        f" generated {generated:%Y-%m-%d %H:%M} UTC by payonce reconcile</p>"
        f"{alert_html}<div class='cards'>{cards}</div>"
        f"{_charts(report)}"
        f"<h2>What these numbers mean</h2><div class='panel'><dl>{definitions}</dl></div>"
        + "".join(sections)
        + f"<h2>Inputs</h2>{inputs}</main></body></html>"
    )
