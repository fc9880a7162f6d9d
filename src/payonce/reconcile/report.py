"""What reconcile found, as frozen values, and their JSON form.

The definitions (also in docs/reconcile.md, "Definitions"):

- a **billed generation** is one provider request id on the bill; its bill lines
  are summed (a bill that lists input and output as two lines is one generation).
  A bill line without a request id is a generation of its own.
- a **business request** is one business id in the call log (for payonce logs: an
  idempotency key within its tenant). A call without a business id is a business
  request of its own, unless it is an unprotected retry (below).
- a generation is **matched** when the call log names its request id.
- a business request with k matched generations has **k - 1 duplicates**: every
  generation but the cheapest one (ties: the earliest, then the smallest request
  id). The **wasted cost** is the cost of the duplicates, so it is a lower bound:
  whichever generation the client actually used, at least that much was paid twice.
  A generation of a retry sent without any business id (``unprotected_retry`` in
  the payonce log) is a duplicate of a call that cannot be named; all of it is waste.
- ``duplicate_ratio`` = duplicate generations / billed generations (the whole bill).
- a business request is **successful** when one of its calls got a 2xx status (or
  a status word such as ``success``; calls without a status count as successful).
- ``cost_per_successful_call_usd`` = total cost of the bill / successful business
  requests.
- an **unmatched** bill line names a request id the call log does not know (or no
  id at all): spend nothing explains. It is in the total, never in the waste.
- an **outlier** is a generation that cost more than ``outlier_factor`` x the
  median cost of its model's non-zero generations (models with at least
  ``outlier_min_generations`` of them).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "Alert",
    "BillItem",
    "Figures",
    "InputSummary",
    "MalformedRow",
    "Outlier",
    "Outliers",
    "Report",
    "Slice",
    "StatedCosts",
    "money",
]

SCHEMA = "payonce.reconcile/1"
UNKNOWN = "(unknown)"
_CENT_BILLIONTHS = Decimal("1e-10")


def money(value: Decimal | float | int | None) -> float:
    """Dollars as a JSON number, to 1e-10 (DuckDB sums them exactly as decimals)."""
    if value is None:
        return 0.0
    return float(Decimal(value).quantize(_CENT_BILLIONTHS))


@dataclass(frozen=True, slots=True)
class Figures:
    """The counts and money of one slice of the data (all of it, a model, a day...)."""

    billed_generations: int = 0
    matched_generations: int = 0
    duplicate_generations: int = 0
    unkeyed_retry_generations: int = 0
    bill_lines: int = 0
    unmatched_bill_lines: int = 0
    total_cost_usd: Decimal = Decimal(0)
    wasted_cost_usd: Decimal = Decimal(0)
    unmatched_cost_usd: Decimal = Decimal(0)
    business_requests: int = 0
    successful_business_requests: int = 0

    @property
    def duplicate_ratio(self) -> float:
        """Duplicate generations / billed generations (0 without generations)."""
        if not self.billed_generations:
            return 0.0
        return self.duplicate_generations / self.billed_generations

    @property
    def cost_per_successful_call_usd(self) -> float | None:
        """Total cost / successful business requests (None without any)."""
        if not self.successful_business_requests:
            return None
        return money(self.total_cost_usd / self.successful_business_requests)

    def as_json(self) -> dict[str, Any]:
        return {
            "billed_generations": self.billed_generations,
            "matched_generations": self.matched_generations,
            "business_requests": self.business_requests,
            "successful_business_requests": self.successful_business_requests,
            "duplicate_generations": self.duplicate_generations,
            "duplicate_ratio": self.duplicate_ratio,
            "unkeyed_retry_generations": self.unkeyed_retry_generations,
            "wasted_cost_usd": money(self.wasted_cost_usd),
            "total_cost_usd": money(self.total_cost_usd),
            "cost_per_successful_call_usd": self.cost_per_successful_call_usd,
            "bill_lines": self.bill_lines,
            "unmatched_bill_lines": self.unmatched_bill_lines,
            "unmatched_cost_usd": money(self.unmatched_cost_usd),
        }


@dataclass(frozen=True, slots=True)
class Slice:
    """The figures of one value of a breakdown (a model, an endpoint, a tag, a day)."""

    key: str | None
    figures: Figures

    @property
    def label(self) -> str:
        return UNKNOWN if self.key is None else self.key


@dataclass(frozen=True, slots=True)
class Outlier:
    """A generation billed far above its model's median."""

    provider_request_id: str | None
    business_id: str | None
    model: str
    cost_usd: Decimal
    model_median_usd: Decimal
    ts: dt.datetime | None
    file: str

    @property
    def ratio(self) -> float:
        return float(self.cost_usd / self.model_median_usd) if self.model_median_usd else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "provider_request_id": self.provider_request_id,
            "business_id": self.business_id,
            "model": self.model,
            "cost_usd": money(self.cost_usd),
            "model_median_usd": money(self.model_median_usd),
            "times_median": round(self.ratio, 2),
            "ts": _iso(self.ts),
            "file": self.file,
        }


@dataclass(frozen=True, slots=True)
class Outliers:
    """Generations above ``factor`` x their model's median cost."""

    factor: float
    min_generations: int
    count: int
    cost_usd: Decimal
    excess_cost_usd: Decimal
    top: tuple[Outlier, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "definition": f"cost > {self.factor:g} x the median cost of the model's"
            f" non-zero generations (models with at least {self.min_generations})",
            "factor": self.factor,
            "count": self.count,
            "cost_usd": money(self.cost_usd),
            "excess_cost_usd": money(self.excess_cost_usd),
            "top": [outlier.as_json() for outlier in self.top],
        }


@dataclass(frozen=True, slots=True)
class BillItem:
    """One unmatched generation: bill lines naming a request id no call knows."""

    provider_request_id: str | None
    cost_usd: Decimal
    lines: int
    model: str | None
    ts: dt.datetime | None
    file: str

    def as_json(self) -> dict[str, Any]:
        return {
            "provider_request_id": self.provider_request_id,
            "cost_usd": money(self.cost_usd),
            "bill_lines": self.lines,
            "model": self.model,
            "ts": _iso(self.ts),
            "file": self.file,
        }


@dataclass(frozen=True, slots=True)
class MalformedRow:
    """A row that could not be read: its file, its line (or record) number, and why."""

    file: str
    line: int
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class InputSummary:
    """One input file as it was read."""

    file: str
    side: str
    format: str
    container: str
    rows: int
    malformed_rows: int
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "side": self.side,
            "format": self.format,
            "container": self.container,
            "rows": self.rows,
            "malformed_rows": self.malformed_rows,
            "note": self.note or None,
        }


@dataclass(frozen=True, slots=True)
class StatedCosts:
    """Calls priced by the cost the provider stated, and the same calls at list price.

    ``difference_usd`` is stated minus list over the calls that have both (a model
    without a list price is left out of the comparison, never counted as free).
    """

    calls: int = 0
    stated_cost_usd: Decimal = Decimal(0)
    calls_with_list_price: int = 0
    compared_stated_cost_usd: Decimal = Decimal(0)
    list_cost_usd: Decimal = Decimal(0)

    @property
    def difference_usd(self) -> Decimal:
        return self.compared_stated_cost_usd - self.list_cost_usd

    def as_json(self) -> dict[str, Any]:
        return {
            "definition": "calls priced by the cost the provider stated (price_source"
            " provider), and the same calls at their list price (list_cost_usd);"
            " difference = stated - list over the calls that have both",
            "calls": self.calls,
            "stated_cost_usd": money(self.stated_cost_usd),
            "calls_with_list_price": self.calls_with_list_price,
            "compared_stated_cost_usd": money(self.compared_stated_cost_usd),
            "list_cost_usd": money(self.list_cost_usd),
            "difference_usd": money(self.difference_usd),
        }


@dataclass(frozen=True, slots=True)
class Alert:
    """A threshold the figures went past."""

    metric: str
    value: float
    threshold: float
    flag: str

    @property
    def message(self) -> str:
        return f"{self.metric} {self.value:.6g} is above {self.flag} {self.threshold:g}"

    def as_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "threshold": self.threshold,
            "flag": self.flag,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class Report:
    """Everything ``payonce reconcile`` found."""

    totals: Figures
    by_model: tuple[Slice, ...]
    by_endpoint: tuple[Slice, ...]
    by_tag: tuple[Slice, ...]
    daily: tuple[Slice, ...]
    outliers: Outliers
    unmatched: tuple[BillItem, ...]
    inputs: tuple[InputSummary, ...]
    malformed_rows: int
    malformed: tuple[MalformedRow, ...]
    unbilled_calls: int
    conflicting_request_ids: int
    period_start: dt.datetime | None
    period_end: dt.datetime | None
    truncated: dict[str, int]
    # The call-log columns the tag and endpoint breakdowns were read from (None: none).
    tag_column: str | None = None
    endpoint_column: str | None = None
    stated_costs: StatedCosts = StatedCosts()

    @property
    def spans_days(self) -> bool:
        return len(self.daily) > 1

    def as_json(self, alerts: tuple[Alert, ...] = ()) -> dict[str, Any]:
        """The ``--json`` document (also the ``--webhook`` body)."""
        return {
            "schema": SCHEMA,
            "status": "alert" if alerts else "ok",
            "alerts": [alert.as_json() for alert in alerts],
            "period": {"start": _iso(self.period_start), "end": _iso(self.period_end)},
            **self.totals.as_json(),
            "unbilled_calls": self.unbilled_calls,
            "conflicting_request_ids": self.conflicting_request_ids,
            "by_model": {s.label: s.figures.as_json() for s in self.by_model},
            "by_endpoint": {s.label: s.figures.as_json() for s in self.by_endpoint},
            "by_tag": {s.label: s.figures.as_json() for s in self.by_tag},
            "tag_column": self.tag_column,
            "endpoint_column": self.endpoint_column,
            "stated_costs": self.stated_costs.as_json(),
            "breakdowns_truncated": self.truncated,
            "daily": [{"date": s.label, **s.figures.as_json()} for s in self.daily],
            "outliers": self.outliers.as_json(),
            "unmatched_top": [item.as_json() for item in self.unmatched],
            "malformed_rows": self.malformed_rows,
            "malformed": [row.as_json() for row in self.malformed],
            "inputs": [source.as_json() for source in self.inputs],
        }


def _iso(moment: dt.datetime | None) -> str | None:
    if moment is None:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC)
    return moment.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
