"""The vectorised model against a one-request-at-a-time implementation, where no closed form exists."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from payonce.simulate.config import Backoff, ProxyConfig, RetryOn, StackConfig
from payonce.simulate.model import simulate
from payonce.simulate.report import figures
from tests.simulate.reference import run_reference
from tests.simulate.test_closed_form import demo_stack

DEMO = demo_stack()
# The reference is plain Python: 20,000 requests keep each case under a second. The
# tolerances are five standard errors or more of that sample.
REFERENCE_REQUESTS = 20_000


@pytest.mark.parametrize(
    "stack",
    [
        pytest.param(DEMO, id="demo"),
        pytest.param(replace(DEMO, payonce=True), id="payonce-proxy-above"),
        pytest.param(
            replace(DEMO, payonce=True, proxy_below_payonce=True), id="payonce-proxy-below"
        ),
        pytest.param(
            replace(
                DEMO,
                payonce=True,
                proxy_below_payonce=True,
                failure_rate=0.1,
                proxy=ProxyConfig(timeout=8.0, retries=2, retry_on=RetryOn.BOTH),
            ),
            id="payonce-faults-proxy-retries-5xx",
        ),
        pytest.param(
            replace(DEMO, deadline=25.0, connect_failure_rate=0.05, failure_rate=0.05),
            id="deadline-connect-failures-faults",
        ),
        pytest.param(
            replace(
                DEMO,
                payonce=True,
                deadline=40.0,
                timeout=6.0,
                sdk_retry_on=RetryOn.TIMEOUT,
                app_retry_on=RetryOn.BOTH,
                app_attempts=3,
                failure_rate=0.2,
            ),
            id="payonce-deadline-sdk-timeouts-only",
        ),
        pytest.param(
            replace(
                DEMO,
                proxy=None,
                timeout=3.0,
                sdk_retries=4,
                sdk_backoff=Backoff(initial=1.0, maximum=5.0, jitter=0.5, multiplier=3.0),
                app_backoff=Backoff(initial=2.0, maximum=2.0, multiplier=1.0),
            ),
            id="custom-backoff",
        ),
    ],
)
def test_vectorised_model_matches_the_reference(stack: StackConfig) -> None:
    reference = run_reference(stack, REFERENCE_REQUESTS, seed=21)
    billed = np.array([result.billed for result in reference])
    success = np.array([result.success for result in reference])
    latency = np.array([result.latency for result in reference])
    outcome = simulate(stack, 200_000, seed=22)
    result = figures(outcome)
    assert result.billed_per_request == pytest.approx(billed.mean(), abs=0.04, rel=0.03)
    expected_ratio = np.maximum(billed - 1, 0).sum() / max(1, billed.sum())
    assert result.duplicate_ratio == pytest.approx(expected_ratio, abs=0.02)
    assert result.success_rate == pytest.approx(success.mean(), abs=0.015)
    assert outcome.latency.mean() == pytest.approx(latency.mean(), rel=0.04)
