"""Generation-time distributions the Monte Carlo draws from, vectorised with NumPy.

Three shapes, all behind :class:`Distribution`:

* ``fixed:<duration>`` and ``lognormal:p50=<duration>,p99=<duration>``: parsed by
  :func:`payonce.sim.config.parse_latency`, the same text ``payonce sim --latency``
  takes, so a simulated provider and the simulator of its cost agree on the model.
* ``empirical:<file>``: observed latencies (:mod:`payonce.simulate.empirical`),
  resampled with replacement.

Each distribution can also say ``cdf(x)`` and ``quantile(q)`` exactly, which the
closed form and the recommended timeout use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

import numpy as np
import numpy.typing as npt

from payonce.errors import ConfigError
from payonce.sim.config import parse_latency as parse_sim_latency
from payonce.sim.latency import FixedLatency, LogNormalLatency
from payonce.simulate.empirical import read_latencies

__all__ = [
    "Distribution",
    "EmpiricalDistribution",
    "FixedDistribution",
    "LogNormalDistribution",
    "parse_distribution",
]

Floats = npt.NDArray[np.float64]
_STANDARD_NORMAL = NormalDist()


class Distribution(Protocol):
    """A distribution of generation times in seconds."""

    def sample(self, rng: np.random.Generator, size: int) -> Floats:
        """``size`` independent draws."""
        ...

    def cdf(self, seconds: float) -> float:
        """P(L <= seconds)."""
        ...

    def quantile(self, probability: float) -> float:
        """The smallest ``x`` with P(L <= x) >= ``probability``."""
        ...

    def describe(self) -> str:
        """The distribution in ``--latency`` syntax."""
        ...


@dataclass(frozen=True, slots=True)
class FixedDistribution:
    """Every generation takes exactly ``seconds``: the case where the closed form is exact."""

    seconds: float

    def sample(self, rng: np.random.Generator, size: int) -> Floats:
        return np.full(size, self.seconds)

    def cdf(self, seconds: float) -> float:
        return 1.0 if seconds >= self.seconds else 0.0

    def quantile(self, probability: float) -> float:
        return self.seconds

    def describe(self) -> str:
        return FixedLatency(self.seconds).describe()


@dataclass(frozen=True, slots=True)
class LogNormalDistribution:
    """``ln(L)`` normal, from the median and the 99th percentile (as ``payonce sim``)."""

    p50: float
    p99: float
    mu: float = field(init=False, repr=False)
    sigma: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # One definition of mu and sigma for the server and the calculator.
        model = LogNormalLatency(self.p50, self.p99)
        object.__setattr__(self, "mu", model.mu)
        object.__setattr__(self, "sigma", model.sigma)

    def sample(self, rng: np.random.Generator, size: int) -> Floats:
        return rng.lognormal(self.mu, self.sigma, size)

    def cdf(self, seconds: float) -> float:
        if seconds <= 0:
            return 0.0
        if self.sigma == 0:
            return 1.0 if seconds >= self.p50 else 0.0
        return _STANDARD_NORMAL.cdf((math.log(seconds) - self.mu) / self.sigma)

    def quantile(self, probability: float) -> float:
        if probability <= 0:
            return 0.0
        if probability >= 1:
            return math.inf
        return math.exp(self.mu + self.sigma * _STANDARD_NORMAL.inv_cdf(probability))

    def describe(self) -> str:
        return LogNormalLatency(self.p50, self.p99).describe()


@dataclass(frozen=True, slots=True)
class EmpiricalDistribution:
    """The observed latencies themselves, drawn with replacement (a bootstrap).

    Nothing is smoothed or extrapolated: the longest observation is the longest
    generation the model can produce, so a small file understates the tail.
    """

    values: tuple[float, ...]
    source: str = ""
    _sorted: Floats = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("an empirical distribution needs at least one latency")
        object.__setattr__(self, "_sorted", np.sort(np.asarray(self.values, dtype=np.float64)))

    def sample(self, rng: np.random.Generator, size: int) -> Floats:
        return self._sorted[rng.integers(0, self._sorted.size, size)]

    def cdf(self, seconds: float) -> float:
        return float(np.searchsorted(self._sorted, seconds, side="right")) / self._sorted.size

    def quantile(self, probability: float) -> float:
        # The inverse of the step cdf above: the k-th smallest value with k/n >= probability.
        rank = max(1, math.ceil(probability * self._sorted.size - 1e-9))
        return float(self._sorted[min(rank, self._sorted.size) - 1])

    def describe(self) -> str:
        return f"empirical:{self.source} ({self._sorted.size} latencies)"


def parse_distribution(text: str, *, flag: str = "--latency") -> Distribution:
    """``fixed:4s``, ``lognormal:p50=4s,p99=30s`` or ``empirical:PATH`` (see the module)."""
    kind, sep, rest = text.strip().partition(":")
    if sep and kind == "empirical":
        if not rest:
            raise ConfigError(f"{flag}: empirical needs a file, empirical:latencies.txt")
        return EmpiricalDistribution(read_latencies(rest, flag=flag), source=rest)
    if kind not in ("fixed", "lognormal"):
        raise ConfigError(
            f"{flag}: {text!r} must be fixed:<duration>, lognormal:p50=..,p99=.. or empirical:FILE"
        )
    model = parse_sim_latency(text, flag=flag)
    if isinstance(model, FixedLatency):
        return FixedDistribution(model.seconds)
    if isinstance(model, LogNormalLatency):
        return LogNormalDistribution(model.p50, model.p99)
    raise ConfigError(f"{flag}: unsupported latency model {text!r}")  # pragma: no cover
