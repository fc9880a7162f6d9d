"""The demo's figures, read from the provider's bill and from what the users saw.

Every bill line names its business request (the request's ``user``, which the
simulated provider records), so duplicates are counted exactly: a business
request billed ``k`` times has ``k - 1`` duplicate generations.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

from payonce.demo.runs import RunResult

__all__ = ["RunFigures", "figures_of"]


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One row of the demo's table (``--json``: these names)."""

    run: str
    title: str
    business_requests: int
    billed_generations: int
    duplicate_generations: int
    duplicate_ratio: float
    cost_usd: float
    wasted_usd: float
    cost_per_success_usd: float | None
    success_rate: float
    latency_p50_s: float  # in the incident's time (the demo's time divided by its scale)
    latency_p99_s: float
    still_generating: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))
    return ordered[index]


def figures_of(result: RunResult, time_scale: float) -> RunFigures:
    """The figures of one run."""
    lines = result.ledger
    per_request = Counter(str(line.get("user", "")) for line in lines)
    duplicates = sum(count - 1 for count in per_request.values())
    cost = sum(float(line["cost_usd"]) for line in lines)
    # Each duplicate cost what its business request's first generation did.
    first_cost: dict[str, float] = {}
    for line in lines:
        first_cost.setdefault(str(line.get("user", "")), float(line["cost_usd"]))
    wasted = cost - sum(first_cost.values())
    successes = sum(1 for outcome in result.outcomes if outcome.ok)
    latencies = [outcome.latency / time_scale for outcome in result.outcomes]
    total = len(result.outcomes)
    return RunFigures(
        run=result.spec.name,
        title=result.spec.title,
        business_requests=total,
        billed_generations=len(lines),
        duplicate_generations=duplicates,
        duplicate_ratio=duplicates / len(lines) if lines else 0.0,
        cost_usd=cost,
        wasted_usd=wasted,
        cost_per_success_usd=cost / successes if successes else None,
        success_rate=successes / total if total else 0.0,
        latency_p50_s=_percentile(latencies, 0.50),
        latency_p99_s=_percentile(latencies, 0.99),
        still_generating=result.still_generating,
    )
