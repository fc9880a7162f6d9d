"""FaultPlan: each status fails its share of requests; an empty plan leaves the seed alone."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from payonce.sim.faults import FaultPlan


def test_each_status_fails_its_share() -> None:
    plan = FaultPlan(((500, 0.05), (429, 0.02), (503, 0.01)))
    rng = random.Random(11)
    draws = 200_000
    counts = Counter(plan.draw(rng) for _ in range(draws))
    assert counts[500] / draws == pytest.approx(0.05, abs=0.003)
    assert counts[429] / draws == pytest.approx(0.02, abs=0.002)
    assert counts[503] / draws == pytest.approx(0.01, abs=0.0015)
    assert counts[None] / draws == pytest.approx(0.92, abs=0.004)


def test_rates_adding_to_one_always_fail() -> None:
    plan = FaultPlan(((500, 0.7), (502, 0.2), (504, 0.1)))
    rng = random.Random(12)
    assert None not in {plan.draw(rng) for _ in range(10_000)}


def test_same_seed_same_failures() -> None:
    plan = FaultPlan(((500, 0.3),))
    rng_a, rng_b = random.Random(5), random.Random(5)
    assert [plan.draw(rng_a) for _ in range(200)] == [plan.draw(rng_b) for _ in range(200)]


def test_empty_plan_never_draws() -> None:
    rng = random.Random(13)
    state = rng.getstate()
    assert FaultPlan().draw(rng) is None
    assert rng.getstate() == state


@pytest.mark.parametrize(
    "failures",
    [
        ((399, 0.1),),
        ((600, 0.1),),
        ((500, 1.1),),
        ((500, -0.1),),
        ((500, 0.1), (500, 0.1)),
        ((500, 0.6), (502, 0.5)),
    ],
)
def test_invalid_plans(failures: tuple[tuple[int, float], ...]) -> None:
    with pytest.raises(ValueError, match=r"\d"):
        FaultPlan(failures)
