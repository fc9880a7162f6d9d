"""The Monte Carlo's semantics: payonce, the proxy below it, faults, connect failures, deadlines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from payonce.simulate.config import SDK_BACKOFF, Backoff, ProxyConfig, RetryOn, StackConfig
from payonce.simulate.latency import FixedDistribution, LogNormalDistribution
from payonce.simulate.model import simulate
from payonce.simulate.report import figures
from tests.simulate.test_closed_form import demo_stack


def test_payonce_bills_one_generation_per_business_request() -> None:
    outcome = simulate(demo_stack(payonce=True), 100_000, seed=2)
    # The proxy above the gateway carries the key too: its retries join.
    assert set(outcome.billed.tolist()) == {1}
    assert figures(outcome).duplicate_ratio == 0.0


def test_payonce_retries_wait_for_the_same_generation() -> None:
    # 25 s never fits a 10 s attempt; without payonce every attempt fails. With it, the
    # retries keep waiting for the one generation, answered to the attempt running at 25 s.
    stack = demo_stack(latency=FixedDistribution(25.0), proxy=None, app_attempts=1, sdk_retries=2)
    without = simulate(stack, 1_000, seed=3)
    with_payonce = simulate(replace(stack, payonce=True), 1_000, seed=3)
    assert not without.success.any() and set(without.billed.tolist()) == {3}
    assert with_payonce.success.all() and set(with_payonce.billed.tolist()) == {1}
    assert np.allclose(with_payonce.latency, 25.0)


def test_a_proxy_below_payonce_still_bills_its_retries() -> None:
    # 9 s outlasts the proxy's 8 s: it abandons the first try (billed at 9 s) and
    # sends a second (billed at 17 s) that times out at 16 s too: 504. The SDK's one
    # retry comes after the record was released, and runs both again.
    stack = demo_stack(
        latency=FixedDistribution(9.0),
        timeout=30.0,
        app_attempts=1,
        sdk_retries=1,
        payonce=True,
        proxy_below_payonce=True,
    )
    outcome = simulate(stack, 1_000, seed=4)
    assert set(outcome.billed.tolist()) == {4}
    assert not outcome.success.any()
    above = simulate(replace(stack, proxy_below_payonce=False), 1_000, seed=4)
    assert set(above.billed.tolist()) == {1}


def test_a_proxy_below_payonce_on_the_demo_stack() -> None:
    below = figures(simulate(demo_stack(payonce=True, proxy_below_payonce=True), 100_000, seed=5))
    outlasts = 1 - LogNormalDistribution(4.0, 30.0).cdf(8.0)
    # At least the proxy's own second tries: 1 + P(L > 8 s) generations per request.
    assert below.billed_per_request > 1 + outlasts - 0.01
    assert below.duplicate_ratio > 0.15


def test_faults_are_not_billed_and_are_retried() -> None:
    stack = StackConfig(latency=FixedDistribution(1.0), timeout=10.0, failure_rate=1.0)
    outcome = simulate(stack, 1_000, seed=6)
    assert not outcome.billed.any() and not outcome.success.any()
    assert set(outcome.attempts.tolist()) == {3}  # the SDK retries 5xx twice


def test_faults_release_the_key_with_payonce() -> None:
    stack = StackConfig(
        latency=FixedDistribution(1.0), timeout=10.0, failure_rate=0.5, payonce=True
    )
    outcome = simulate(stack, 20_000, seed=7)
    assert outcome.billed.max() == 1
    # A request fails only when all 3 attempts met a fault: 1/8.
    assert outcome.success.mean() == pytest.approx(1 - 0.5**3, abs=0.01)


def test_connect_failures_cost_the_connect_timeout_and_nothing_on_the_bill() -> None:
    stack = StackConfig(
        latency=FixedDistribution(1.0),
        timeout=10.0,
        connect_timeout=3.0,
        connect_failure_rate=1.0,
        sdk_backoff=Backoff(0.0, 0.0),
    )
    outcome = simulate(stack, 100, seed=8)
    assert not outcome.billed.any()
    assert np.allclose(outcome.latency, 9.0)  # three attempts of 3 s


def test_the_deadline_ends_the_request_and_its_retries() -> None:
    stack = demo_stack(latency=FixedDistribution(12.0), proxy=None, deadline=25.0)
    outcome = simulate(stack, 1_000, seed=9)
    # Attempts at 0 and ~10.5 s time out; the third starts near 21 s and is cut at 25 s.
    assert set(outcome.attempts.tolist()) == {3}
    assert np.allclose(outcome.latency, 25.0)
    assert not outcome.success.any()


def test_the_app_retries_only_the_errors_it_is_told_to() -> None:
    always_504 = demo_stack(
        latency=FixedDistribution(12.0),
        timeout=30.0,
        proxy=ProxyConfig(timeout=8.0, retries=0),
    )
    assert set(simulate(always_504, 100, seed=10).attempts.tolist()) == {3}
    both = replace(always_504, app_retry_on=RetryOn.BOTH)
    assert set(simulate(both, 100, seed=10).attempts.tolist()) == {6}


def test_the_sdk_backoff_is_the_openai_formula() -> None:
    # Every attempt fails at once; the time between them is the backoff alone.
    stack = StackConfig(latency=FixedDistribution(1.0), failure_rate=1.0, sdk_retries=6)
    latency = simulate(stack, 50_000, seed=11).latency
    ceilings = [min(0.5 * 2**n, 8.0) for n in range(6)]
    assert latency.max() <= sum(ceilings)
    assert latency.min() >= 0.75 * sum(ceilings)
    assert latency.mean() == pytest.approx(0.875 * sum(ceilings), rel=0.01)
    assert SDK_BACKOFF.describe() == "sdk"


def test_a_seed_repeats_a_run() -> None:
    first, second = (figures(simulate(demo_stack(), 10_000, seed=12)) for _ in range(2))
    assert first == second
