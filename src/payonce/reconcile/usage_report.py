"""What the aggregated reconciliation found: the figures per bucket, model, key and in all.

Definitions (also in docs/reconcile.md, "Usage and cost reports"):

- **billed_requests**: the provider's request count (OpenAI ``num_model_requests``);
  ``None`` where the report gives none (Anthropic), never estimated.
- **logged_upstream_calls**: calls the gateway's log says it sent and the upstream
  answered with a 2xx, or that it cancelled after sending (the provider may have
  billed those). Replays and joins sent nothing.
- **business_requests**: idempotency keys within their tenant (an unkeyed call is
  its own, unless it is an unprotected retry).
- **duplicate_requests**: logged upstream calls beyond one per business request
  (every one but the cheapest), and every unprotected retry (an unkeyed retry
  sent by an SDK).
- **unexplained_requests** = max(0, billed - logged): calls the provider billed
  that the log never sent (another application on the same key, a retrying proxy
  behind the gateway, calls that bypassed it). **unbilled_calls** is the other
  way round (cancelled before the provider counted them, or the edge of a bucket).
- **unexplained input/output tokens** = max(0, billed - logged). Providers and
  gateways disagree by a few tokens, so where the request counts agree (or there
  are none: Anthropic) they count only past ``token_tolerance`` of the billed
  tokens; where the provider billed more requests than were sent, all of the
  difference is those requests' tokens. A slice whose requests or tokens differ
  so is *flagged*.
- Differences are taken per model and key (and per bucket for the bucket rows)
  and then added: calls of one key never explain usage of another. The period's
  figures are taken over the whole period, so a call logged a moment after the
  end of the bucket the provider put it in cancels out there.
- Money: ``billed_cost_usd`` prices the report's tokens with the price table;
  ``wasted_cost_usd`` is what the log says the duplicates cost;
  ``unexplained_cost_usd`` prices the unexplained tokens. With a cost report, its
  totals are compared with the log's costs day by day (:class:`CostDay`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any

from payonce.reconcile.report import Alert, InputSummary, MalformedRow, money

__all__ = ["CostDay", "UsageFigures", "UsageReport", "UsageSlice"]

SCHEMA = "payonce.reconcile.usage/1"


@dataclass(frozen=True, slots=True)
class UsageFigures:
    """The comparison of one slice: a bucket, a model, a key, a provider or everything."""

    billed_requests: int | None = None
    logged_upstream_calls: int = 0
    business_requests: int = 0
    successful_business_requests: int = 0
    duplicate_requests: int = 0
    unexplained_requests: int | None = None
    unbilled_calls: int | None = None
    billed_input_tokens: int = 0
    billed_cached_input_tokens: int = 0
    billed_output_tokens: int = 0
    logged_input_tokens: int = 0
    logged_output_tokens: int = 0
    unknown_usage_calls: int = 0
    unexplained_input_tokens: int = 0
    unexplained_output_tokens: int = 0
    billed_cost_usd: Decimal | None = None
    logged_cost_usd: Decimal = Decimal(0)
    wasted_cost_usd: Decimal = Decimal(0)
    unexplained_cost_usd: Decimal | None = None
    unpriced_calls: int = 0
    flagged: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> UsageFigures:
        """Build from a query row with these field names (extra columns are ignored)."""
        values: dict[str, Any] = {}
        for item in fields(cls):
            value = row.get(item.name)
            if value is None:
                continue
            if item.name.endswith("_usd"):
                values[item.name] = Decimal(value)
            elif item.name == "flagged":
                values[item.name] = bool(value)
            else:
                values[item.name] = int(value)
        return cls(**values)

    @property
    def unexplained_tokens(self) -> int:
        return self.unexplained_input_tokens + self.unexplained_output_tokens

    @property
    def duplicate_ratio(self) -> float | None:
        """Duplicate requests / billed requests (``None`` without a request count)."""
        if not self.billed_requests:
            return None
        return self.duplicate_requests / self.billed_requests

    @property
    def duplicate_cost_ratio(self) -> float | None:
        """Wasted cost / billed cost: the ratio that needs no request count."""
        if not self.billed_cost_usd:
            return None
        return float(self.wasted_cost_usd / self.billed_cost_usd)

    @property
    def cost_per_successful_call_usd(self) -> float | None:
        if not self.successful_business_requests or self.billed_cost_usd is None:
            return None
        return money(self.billed_cost_usd / self.successful_business_requests)

    def as_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.endswith("_usd"):
                value = None if value is None else money(value)
            document[item.name] = value
        document["unexplained_tokens"] = self.unexplained_tokens
        document["duplicate_ratio"] = self.duplicate_ratio
        document["duplicate_cost_ratio"] = self.duplicate_cost_ratio
        document["cost_per_successful_call_usd"] = self.cost_per_successful_call_usd
        return document


@dataclass(frozen=True, slots=True)
class UsageSlice:
    """One value of a breakdown (a bucket start, a model, a key id, a provider)."""

    key: str
    figures: UsageFigures


@dataclass(frozen=True, slots=True)
class CostDay:
    """A cost report's bucket against the log's cost of the calls in it."""

    provider: str
    start: dt.datetime
    billed_cost_usd: Decimal
    logged_cost_usd: Decimal
    unexplained_cost_usd: Decimal
    flagged: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "start": _iso(self.start),
            "billed_cost_usd": money(self.billed_cost_usd),
            "logged_cost_usd": money(self.logged_cost_usd),
            "unexplained_cost_usd": money(self.unexplained_cost_usd),
            "flagged": self.flagged,
        }


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Everything ``payonce reconcile`` found against usage and cost reports."""

    totals: UsageFigures
    by_provider: tuple[UsageSlice, ...]
    by_model: tuple[UsageSlice, ...]
    by_key: tuple[UsageSlice, ...]
    buckets: tuple[UsageSlice, ...]
    cost_days: tuple[CostDay, ...]
    bucket_width_s: dict[str, int]
    key_column: str | None
    token_tolerance: float
    not_computed: dict[str, str]
    calls_outside: dict[str, int]
    notes: tuple[str, ...]
    inputs: tuple[InputSummary, ...]
    malformed_rows: int
    malformed: tuple[MalformedRow, ...]
    period_start: dt.datetime | None
    period_end: dt.datetime | None

    @property
    def flagged_buckets(self) -> tuple[UsageSlice, ...]:
        return tuple(item for item in self.buckets if item.figures.flagged)

    @property
    def cost_report_unexplained_usd(self) -> Decimal | None:
        """Unexplained money by the cost report (``None`` without one)."""
        if not self.cost_days:
            return None
        return Decimal(sum((day.unexplained_cost_usd for day in self.cost_days), Decimal(0)))

    @property
    def unexplained_cost_usd(self) -> Decimal | None:
        """The cost report's figure when there is one, else the priced tokens'."""
        from_costs = self.cost_report_unexplained_usd
        return from_costs if from_costs is not None else self.totals.unexplained_cost_usd

    @property
    def unexplained_cost_basis(self) -> str:
        return "cost report" if self.cost_days else "price table"

    def as_json(self, alerts: tuple[Alert, ...] = ()) -> dict[str, Any]:
        """The ``--json`` document (also the ``--webhook`` body)."""
        unexplained = self.unexplained_cost_usd
        billed_costs = sum((day.billed_cost_usd for day in self.cost_days), Decimal(0))
        logged_costs = sum((day.logged_cost_usd for day in self.cost_days), Decimal(0))
        return {
            "schema": SCHEMA,
            "status": "alert" if alerts else "ok",
            "alerts": [alert.as_json() for alert in alerts],
            "period": {"start": _iso(self.period_start), "end": _iso(self.period_end)},
            "bucket_width_s": self.bucket_width_s,
            "key_column": self.key_column,
            "token_tolerance": self.token_tolerance,
            **self.totals.as_json(),
            "unexplained_cost_usd": None if unexplained is None else money(unexplained),
            "unexplained_cost_basis": self.unexplained_cost_basis,
            "priced_unexplained_cost_usd": (
                None
                if self.totals.unexplained_cost_usd is None
                else money(self.totals.unexplained_cost_usd)
            ),
            "not_computed": self.not_computed,
            "calls_outside_reports": self.calls_outside,
            "notes": list(self.notes),
            "by_provider": {s.key: s.figures.as_json() for s in self.by_provider},
            "by_model": {s.key: s.figures.as_json() for s in self.by_model},
            "by_key": {s.key: s.figures.as_json() for s in self.by_key},
            "buckets": [{"start": s.key, **s.figures.as_json()} for s in self.buckets],
            "flagged_buckets": len(self.flagged_buckets),
            "cost_report": (
                {
                    "billed_cost_usd": money(billed_costs),
                    "logged_cost_usd": money(logged_costs),
                    "unexplained_cost_usd": money(self.cost_report_unexplained_usd),
                    "days": [day.as_json() for day in self.cost_days],
                }
                if self.cost_days
                else None
            ),
            "malformed_rows": self.malformed_rows,
            "malformed": [row.as_json() for row in self.malformed],
            "inputs": [source.as_json() for source in self.inputs],
        }


def _iso(moment: dt.datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
