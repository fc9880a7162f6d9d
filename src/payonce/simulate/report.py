"""The figures of a run, the recommended timeout, and the ``--json`` document.

Definitions (the same as ``payonce reconcile``'s, docs/reconcile.md "Definitions"):

* **billed per request**: generations the provider billed / business requests.
* **duplicate ratio**: duplicate generations / billed generations, where a
  business request's first billed generation is not a duplicate and every later
  one is.
* **success rate**: business requests whose application got an answer.
* **latency**: seconds from a business request's start until the application
  returned, with the answer or with its last error (every request counts).
* **wasted per million**: duplicate generations per million business requests
  times ``--price-per-call``.
* **recommended timeout**: the smallest client timeout whose false-timeout rate
  is at most the target. A false timeout is an attempt that timed out although
  its generation finished later, and was billed; for one attempt its rate at
  timeout ``t`` is ``P(L > t)``, so the recommendation is the latency's
  ``1 - target`` quantile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from payonce.simulate.closed_form import ClosedForm, closed_form
from payonce.simulate.config import StackConfig
from payonce.simulate.model import Outcome, simulate

__all__ = ["JSON_KEYS", "Figures", "Report", "figures", "recommended_timeout", "run_report"]

# The --json document, key by key (issue 14); nothing else goes in it, so tools can rely on it.
JSON_KEYS = (
    "billed_per_request",
    "duplicate_ratio",
    "success_rate",
    "latency_p50_s",
    "latency_p99_s",
    "wasted_usd_per_million",
    "recommended_timeout_s",
)


@dataclass(frozen=True, slots=True)
class Figures:
    """The summary of one Monte Carlo run."""

    requests: int
    attempts_per_request: float
    billed_per_request: float
    duplicate_ratio: float
    success_rate: float
    latency_p50_s: float
    latency_p99_s: float

    @property
    def duplicates_per_request(self) -> float:
        return self.billed_per_request * self.duplicate_ratio


def figures(outcome: Outcome) -> Figures:
    """Reduce a run's per-request arrays to its figures."""
    billed = int(outcome.billed.sum())
    duplicates = int(np.maximum(outcome.billed - 1, 0).sum())
    p50, p99 = np.quantile(outcome.latency, [0.5, 0.99])
    return Figures(
        requests=outcome.requests,
        attempts_per_request=float(outcome.attempts.mean()),
        billed_per_request=billed / outcome.requests,
        duplicate_ratio=duplicates / billed if billed else 0.0,
        success_rate=float(outcome.success.mean()),
        latency_p50_s=float(p50),
        latency_p99_s=float(p99),
    )


@dataclass(frozen=True, slots=True)
class Report:
    """What ``payonce simulate`` reports: the stack without payonce and with it.

    ``selected`` is the one the user asked for (``--payonce`` or not), which the
    ``--json`` document describes; the other is there for comparison. ``closed`` is
    the exact answer for the stack without payonce when it is a simple case.
    """

    stack: StackConfig
    without_payonce: Figures
    with_payonce: Figures
    closed: ClosedForm | None
    price_per_call: float
    target_false_timeouts: float
    recommended_timeout_s: float
    false_timeouts_at_timeout: float

    @property
    def selected(self) -> Figures:
        return self.with_payonce if self.stack.payonce else self.without_payonce

    def wasted_usd_per_million(self, result: Figures) -> float:
        """Duplicate generations per million business requests, at ``price_per_call``."""
        return result.duplicates_per_request * self.price_per_call * 1_000_000

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document of :attr:`selected`: exactly :data:`JSON_KEYS`."""
        result = self.selected
        return {
            "billed_per_request": result.billed_per_request,
            "duplicate_ratio": result.duplicate_ratio,
            "success_rate": result.success_rate,
            "latency_p50_s": result.latency_p50_s,
            "latency_p99_s": result.latency_p99_s,
            "wasted_usd_per_million": self.wasted_usd_per_million(result),
            "recommended_timeout_s": self.recommended_timeout_s,
        }


def run_report(
    stack: StackConfig,
    requests: int,
    *,
    seed: int | None,
    price_per_call: float,
    target_false_timeouts: float,
) -> Report:
    """Simulate ``stack`` without payonce and with it, from the same seed."""
    without = replace(stack, payonce=False)
    return Report(
        stack=stack,
        without_payonce=figures(simulate(without, requests, seed=seed)),
        with_payonce=figures(simulate(replace(stack, payonce=True), requests, seed=seed)),
        closed=closed_form(without),
        price_per_call=price_per_call,
        target_false_timeouts=target_false_timeouts,
        recommended_timeout_s=recommended_timeout(stack, target_false_timeouts),
        false_timeouts_at_timeout=1.0 - stack.latency.cdf(stack.timeout),
    )


def recommended_timeout(stack: StackConfig, target: float) -> float:
    """The smallest timeout ``t`` with ``P(L > t) <= target`` (the ``1 - target`` quantile)."""
    # Nine significant digits: exp(log(...)) returns 30.000000000000014 for a p99 of 30 s.
    return float(f"{stack.latency.quantile(1.0 - target):.9g}")
