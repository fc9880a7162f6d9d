"""What one upstream call did and cost: the facts the call log, metrics and spans report.

Filled in by the gateway as the call runs; read by :mod:`payonce.observe`. It
lives here, below the gateway, so that observe never imports the gateway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["UpstreamFacts"]


@dataclass(slots=True)
class UpstreamFacts:
    """What one upstream call did and cost."""

    status: int | None = None
    request_id: str | None = None
    model: str | None = None
    usage: Mapping[str, int] | None = None
    cost_usd: float | None = None
    # Who priced cost_usd: "provider", "prices-file" or "genai-prices" (observe/pricing.py).
    price_source: str | None = None
    # The list price of the call when the provider stated cost_usd ("provider"), else None.
    list_cost_usd: float | None = None
    latency: float | None = None
    attempts: int = 0
    stream: bool = False
    started: float = 0.0  # time.perf_counter() when the call began
    # The gateway stopped the call (its client left, --on-disconnect cancel).
    cancelled: bool = False
    # Its OpenTelemetry span while the call runs (observe/tracing.py), else None.
    span: Any = None
    # Why ``usage`` is unknown, when the call's path knows better than
    # :meth:`usage_missing_reason` can tell (docs/call-log.md).
    usage_missing: str | None = None
    # Why its answer was relayed but not stored, its key released: "too_large",
    # "upstream_error" or "store_unavailable" (observe/limit_metrics.py UNSTORED_REASONS).
    not_stored: str | None = None

    def usage_missing_reason(self) -> str | None:
        """Why this call's usage is unknown (``None`` when it is known)."""
        if self.usage is not None:
            return None
        if self.usage_missing is not None:
            return self.usage_missing
        if self.cancelled or self.status is None:
            return "no_response"  # nothing came back whole: no usage to read
        return "not_in_response"

    def sent(self, attempts: int) -> None:
        """Note that attempt number ``attempts`` is being sent (connect retries count)."""
        self.attempts = attempts
