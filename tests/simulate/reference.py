"""The stack's semantics written the obvious way: one business request at a time, nested loops.

An independent second implementation of docs/simulate.md, to check the vectorised
model where no closed form exists (payonce, faults, connect failures, deadlines,
proxies above or below the gateway). It shares nothing with
``payonce.simulate.model`` but the config values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from payonce.simulate.config import Backoff, RetryOn, StackConfig

# (arrive, give_up) -> (answer time, ok)
Layer = Callable[[float, float], tuple[float, bool]]


@dataclass
class Result:
    billed: int
    success: bool
    latency: float


def run_reference(stack: StackConfig, requests: int, seed: int) -> list[Result]:
    rng = random.Random(seed)
    numpy_rng = np.random.default_rng(seed)
    draws = iter(stack.latency.sample(numpy_rng, requests * stack.max_attempts * 8).tolist())
    return [_one(stack, rng, draws) for _ in range(requests)]


def _wait(backoff: Backoff, retry: int, rng: random.Random) -> float:
    return min(backoff.initial * backoff.multiplier**retry, backoff.maximum) * (
        1 - backoff.jitter * rng.random()
    )


def _retries(retry_on: RetryOn, kind: str) -> bool:
    return (kind == "timeout" and retry_on.timeouts) or (kind == "5xx" and retry_on.server_errors)


def _one(stack: StackConfig, rng: random.Random, draws: object) -> Result:
    billed = 0
    record: list[tuple[float, bool]] = []  # payonce's record for this key, at most one

    def provider(arrive: float, give_up: float) -> tuple[float, bool]:
        nonlocal billed
        if stack.failure_rate and rng.random() < stack.failure_rate:
            return arrive, False
        billed += 1
        return arrive + next(draws), True  # type: ignore[call-overload]

    def proxy(below: Layer) -> Layer:
        assert stack.proxy is not None
        config = stack.proxy

        def call(arrive: float, give_up: float) -> tuple[float, bool]:
            start = arrive
            for attempt in range(config.retries + 1):
                if start >= give_up:
                    return math.inf, False  # the client left: no more tries
                last = attempt == config.retries
                answer, ok = below(start, start + config.timeout)
                if answer <= start + config.timeout:
                    if not ok and not last and config.retry_on.server_errors:
                        start = answer
                        continue
                    return answer, ok
                if last or not config.retry_on.timeouts:
                    return start + config.timeout, False  # 504
                start += config.timeout
            raise AssertionError("unreachable")

        return call

    def gateway(upstream: Layer) -> Layer:
        def call(arrive: float, give_up: float) -> tuple[float, bool]:
            if record:
                end, ok = record[0]
                if ok or arrive < end:
                    return max(arrive, end), ok
            answer, ok = upstream(arrive, math.inf)
            record[:] = [(answer, ok)]
            return answer, ok

        return call

    top: Layer = provider
    if stack.payonce:
        below_gateway: Layer = provider
        if stack.proxy and stack.proxy_below_payonce:
            below_gateway = proxy(provider)
        top = gateway(below_gateway)
        if stack.proxy and not stack.proxy_below_payonce:
            top = proxy(top)
    elif stack.proxy:
        top = proxy(provider)

    deadline = math.inf if stack.deadline is None else stack.deadline
    now = 0.0
    for app in range(stack.app_attempts):
        kind = ""
        for retry in range(stack.sdk_retries + 1):
            window = min(stack.timeout, deadline - now)
            if stack.connect_failure_rate and rng.random() < stack.connect_failure_rate:
                now += min(stack.connect_timeout, window)
                kind = "timeout"
            else:
                answer, ok = top(now, now + window)
                if answer <= now + window:
                    if ok:
                        return Result(billed, True, answer)
                    now, kind = answer, "5xx"
                else:
                    now, kind = now + window, "timeout"
            if now >= deadline - 1e-9:
                return Result(billed, False, now)
            if retry == stack.sdk_retries or not _retries(stack.sdk_retry_on, kind):
                break
            now = min(now + _wait(stack.sdk_backoff, retry, rng), deadline)
            if now >= deadline - 1e-9:
                return Result(billed, False, now)
        if app == stack.app_attempts - 1 or not _retries(stack.app_retry_on, kind):
            return Result(billed, False, now)
        now = min(now + _wait(stack.app_backoff, app, rng), deadline)
        if now >= deadline - 1e-9:
            return Result(billed, False, now)
    raise AssertionError("unreachable")
