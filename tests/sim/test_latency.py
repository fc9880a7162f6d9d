"""Latency models: lognormal honours its p50 and p99; a seed repeats a run."""

from __future__ import annotations

import random
import statistics

import pytest

from payonce.sim.latency import FixedLatency, LogNormalLatency


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[int(fraction * (len(ordered) - 1))]


@pytest.mark.parametrize(("p50", "p99"), [(3.0, 30.0), (0.2, 0.5), (1.0, 10.0)])
def test_lognormal_honours_p50_and_p99(p50: float, p99: float) -> None:
    model = LogNormalLatency(p50, p99)
    rng = random.Random(1)
    samples = [model.sample(rng) for _ in range(40_000)]
    assert statistics.median(samples) == pytest.approx(p50, rel=0.05)
    assert percentile(samples, 0.99) == pytest.approx(p99, rel=0.12)
    assert min(samples) > 0


def test_lognormal_is_heavy_tailed() -> None:
    # The mean sits well above the median: the tail that makes timeouts fire.
    model = LogNormalLatency(1.0, 10.0)
    rng = random.Random(2)
    samples = [model.sample(rng) for _ in range(20_000)]
    assert statistics.fmean(samples) > 1.5 * statistics.median(samples)


def test_same_seed_same_delays_other_seed_other_delays() -> None:
    model = LogNormalLatency(3.0, 30.0)
    rng_a, rng_b, rng_c = random.Random(7), random.Random(7), random.Random(8)
    run_a = [model.sample(rng_a) for _ in range(100)]
    run_b = [model.sample(rng_b) for _ in range(100)]
    run_c = [model.sample(rng_c) for _ in range(100)]
    assert run_a == run_b
    assert run_a != run_c


def test_equal_percentiles_degenerate_to_a_fixed_delay() -> None:
    model = LogNormalLatency(0.5, 0.5)
    rng = random.Random(3)
    assert {round(model.sample(rng), 9) for _ in range(100)} == {0.5}


def test_fixed_never_draws() -> None:
    model = FixedLatency(0.25)
    rng = random.Random(4)
    state = rng.getstate()
    assert [model.sample(rng) for _ in range(5)] == [0.25] * 5
    assert rng.getstate() == state


@pytest.mark.parametrize(("p50", "p99"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (1.0, float("inf"))])
def test_lognormal_refuses_impossible_percentiles(p50: float, p99: float) -> None:
    with pytest.raises(ValueError, match="p"):
        LogNormalLatency(p50, p99)


def test_fixed_refuses_negative() -> None:
    with pytest.raises(ValueError, match="latency"):
        FixedLatency(-0.1)
