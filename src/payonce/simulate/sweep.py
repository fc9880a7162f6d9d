"""The stack's figures as the client timeout varies, with and without payonce (the plot's data)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from payonce.simulate.config import StackConfig
from payonce.simulate.model import simulate
from payonce.simulate.report import Figures, figures

__all__ = ["Sweep", "SweepPoint", "sweep", "timeout_grid"]


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """The figures at one client timeout, for the stack without and with payonce."""

    timeout: float
    without_payonce: Figures
    with_payonce: Figures


@dataclass(frozen=True, slots=True)
class Sweep:
    """Points in increasing timeout; ``timeout`` is the configured one (also a point)."""

    points: tuple[SweepPoint, ...]
    timeout: float
    recommended: float


def timeout_grid(stack: StackConfig, recommended: float, points: int = 24) -> tuple[float, ...]:
    """Timeouts spaced evenly on a log scale around the interesting part of the latency.

    From a tenth of the median (nearly every attempt times out) to twice the larger
    of the configured and the recommended timeout, plus the configured one itself.
    """
    median = stack.latency.quantile(0.5)
    low = max(median / 10, 0.01) if median > 0 else 0.01
    high = 2 * max(stack.timeout, recommended, low * 10)
    ratio = math.log(high / low)
    grid = {low * math.exp(ratio * i / (points - 1)) for i in range(points)}
    grid.add(stack.timeout)
    return tuple(sorted(grid))


def sweep(
    stack: StackConfig, recommended: float, *, requests: int, seed: int | None, points: int = 24
) -> Sweep:
    """Simulate ``requests`` business requests at each timeout of :func:`timeout_grid`.

    Every point uses the same seed (common random numbers), so the curves are smooth
    and their differences come from the timeout, not from sampling noise.
    """
    results = []
    for timeout in timeout_grid(stack, recommended, points):
        at = replace(stack, timeout=timeout)
        results.append(
            SweepPoint(
                timeout=timeout,
                without_payonce=figures(simulate(replace(at, payonce=False), requests, seed=seed)),
                with_payonce=figures(simulate(replace(at, payonce=True), requests, seed=seed)),
            )
        )
    return Sweep(points=tuple(results), timeout=stack.timeout, recommended=recommended)
