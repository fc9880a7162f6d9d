"""How long a simulated generation takes.

A model is a frozen value with one method, ``sample(rng)``, returning seconds.
The caller owns the ``random.Random`` so that ``--seed`` makes a whole run
repeatable: the same seed and the same sequence of requests give the same delays.

Real LLM latency is heavy-tailed (a long answer or a busy replica takes many times
the median), which is what makes a client timeout fire while the provider keeps
generating and billing. :class:`LogNormalLatency` models that tail from two numbers
anyone can read off a dashboard: the median and the 99th percentile.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Z_99", "FixedLatency", "LatencyModel", "LogNormalLatency"]

# The standard normal quantile at 0.99 (Phi^-1(0.99)); turns a p99 into a sigma.
Z_99 = 2.3263478740408408


class LatencyModel(Protocol):
    """A distribution of generation times."""

    def sample(self, rng: random.Random) -> float:
        """One generation time in seconds (never negative)."""
        ...

    def describe(self) -> str:
        """The model in ``--latency`` syntax, for the startup line."""
        ...


@dataclass(frozen=True, slots=True)
class FixedLatency:
    """Every generation takes exactly ``seconds``. ``FixedLatency(0)`` is for benchmarks."""

    seconds: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.seconds) or self.seconds < 0:
            raise ValueError(f"latency must be a finite number of seconds >= 0, got {self.seconds}")

    def sample(self, rng: random.Random) -> float:
        return self.seconds

    def describe(self) -> str:
        return f"fixed:{_format_seconds(self.seconds)}"


@dataclass(frozen=True, slots=True)
class LogNormalLatency:
    """Log-normal generation times with the given median (``p50``) and 99th percentile.

    ``ln(T)`` is normal with ``mu = ln(p50)`` and ``sigma = (ln(p99) - ln(p50)) / Z_99``,
    where ``Z_99 ~= 2.326`` is the standard normal 0.99 quantile; so half the samples
    are below ``p50`` and 1% are above ``p99``. ``p99 == p50`` degenerates to a fixed delay.
    """

    p50: float
    p99: float
    mu: float = field(init=False, repr=False)
    sigma: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p50) and self.p50 > 0):
            raise ValueError(f"p50 must be > 0, got {self.p50}")
        if not (math.isfinite(self.p99) and self.p99 >= self.p50):
            raise ValueError(f"p99 must be >= p50, got p50={self.p50} p99={self.p99}")
        # Derived once here so sample() is one library call per request.
        object.__setattr__(self, "mu", math.log(self.p50))
        object.__setattr__(self, "sigma", (math.log(self.p99) - math.log(self.p50)) / Z_99)

    def sample(self, rng: random.Random) -> float:
        return rng.lognormvariate(self.mu, self.sigma)

    def describe(self) -> str:
        return f"lognormal:p50={_format_seconds(self.p50)},p99={_format_seconds(self.p99)}"


def _format_seconds(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"
