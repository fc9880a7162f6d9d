"""The Monte Carlo against the closed form (issue 14): within 2 points, exact when latency is fixed."""

from __future__ import annotations

import math

import pytest

from payonce.simulate.closed_form import closed_form
from payonce.simulate.config import Backoff, ProxyConfig, RetryOn, StackConfig
from payonce.simulate.latency import FixedDistribution, LogNormalDistribution
from payonce.simulate.model import simulate
from payonce.simulate.report import figures

DEMO_LATENCY = LogNormalDistribution(4.0, 30.0)
# Enough business requests that the Monte Carlo's standard error on the duplicate
# ratio is about 0.1 point: a 2-point tolerance is twenty of them, never flaky.
REQUESTS = 200_000


def demo_stack(**changes: object) -> StackConfig:
    """The demo's configuration (issue 14): 2 app attempts x 3 SDK attempts x 2 proxy tries."""
    settings: dict[str, object] = {
        "latency": DEMO_LATENCY,
        "timeout": 10.0,
        "app_attempts": 2,
        "app_backoff": Backoff(0.3, 0.3, multiplier=1.0),
        "sdk_retries": 2,
        "proxy": ProxyConfig(timeout=8.0, retries=1),
    }
    settings.update(changes)
    return StackConfig(**settings)  # type: ignore[arg-type]


def test_the_demo_configuration_has_the_closed_form_of_the_issue() -> None:
    exact = closed_form(demo_stack())
    assert exact is not None
    outlasts = 1 - DEMO_LATENCY.cdf(8.0)
    fails = outlasts * (1 - DEMO_LATENCY.cdf(2.0))
    attempts = sum(fails**k for k in range(6))
    assert exact.billed_per_request == pytest.approx(attempts * (1 + outlasts))
    assert exact.billed_per_request == pytest.approx(1.4545, abs=1e-3)
    assert exact.duplicate_ratio == pytest.approx(0.3125, abs=1e-3)


@pytest.mark.parametrize(
    "stack",
    [
        pytest.param(demo_stack(), id="demo"),
        pytest.param(demo_stack(proxy=None), id="no-proxy"),
        pytest.param(demo_stack(app_attempts=1), id="no-app-retries"),
        pytest.param(demo_stack(sdk_retries=0, app_attempts=3), id="app-only"),
        pytest.param(
            demo_stack(timeout=20.0, proxy=ProxyConfig(timeout=4.0, retries=2)),
            id="proxy-504-before-the-timeout",
        ),
        pytest.param(
            demo_stack(
                timeout=20.0,
                app_attempts=3,
                sdk_retries=1,
                sdk_retry_on=RetryOn.TIMEOUT,
                proxy=ProxyConfig(timeout=4.0, retries=2),
            ),
            id="sdk-does-not-retry-504",
        ),
    ],
)
def test_monte_carlo_within_two_points_of_the_closed_form(stack: StackConfig) -> None:
    exact = closed_form(stack)
    assert exact is not None and exact.success_rate is not None
    result = figures(simulate(stack, REQUESTS, seed=14))
    assert abs(result.duplicate_ratio - exact.duplicate_ratio) < 0.02
    assert result.billed_per_request == pytest.approx(exact.billed_per_request, rel=0.02)
    assert result.attempts_per_request == pytest.approx(exact.attempts_per_request, rel=0.02)
    assert abs(result.success_rate - exact.success_rate) < 0.02


@pytest.mark.parametrize(
    ("seconds", "proxy", "billed"),
    [
        # Every attempt times out: 2 app attempts x 3 SDK attempts.
        (12.0, None, 6),
        # ... and the proxy re-sends each at 8 s, before the client gives up at 10 s.
        (12.0, ProxyConfig(timeout=8.0, retries=1), 12),
        # Answered by the first try: billed once, no duplicate.
        (5.0, ProxyConfig(timeout=8.0, retries=1), 1),
        # The proxy's second try (at 8 s) answers at 17 s: too late for the 10 s timeout.
        (9.0, ProxyConfig(timeout=8.0, retries=1), 12),
    ],
)
def test_fixed_latency_is_exact(seconds: float, proxy: ProxyConfig | None, billed: int) -> None:
    stack = demo_stack(latency=FixedDistribution(seconds), proxy=proxy)
    exact = closed_form(stack)
    assert exact is not None
    outcome = simulate(stack, 1_000, seed=1)
    assert exact.billed_per_request == billed
    assert set(outcome.billed.tolist()) == {billed}
    assert figures(outcome).duplicate_ratio == pytest.approx(exact.duplicate_ratio)
    assert math.isclose(exact.duplicate_ratio, (billed - 1) / billed)


@pytest.mark.parametrize(
    "changes",
    [
        {"failure_rate": 0.05},
        {"connect_failure_rate": 0.05},
        {"deadline": 30.0},
        {"payonce": True, "proxy_below_payonce": True},
    ],
)
def test_no_closed_form_outside_the_simple_cases(changes: dict[str, object]) -> None:
    assert closed_form(demo_stack(**changes)) is None


def test_payonce_closed_form_is_one_generation() -> None:
    exact = closed_form(demo_stack(payonce=True))
    assert exact is not None
    assert (exact.billed_per_request, exact.duplicate_ratio, exact.success_rate) == (1.0, 0.0, None)
