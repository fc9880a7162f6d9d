"""Exact answers for the simple cases, to check the Monte Carlo and to explain it.

Without payonce, faults, connect failures or a deadline, every SDK attempt is an
independent trial with the same odds, so the figures follow from the latency's
distribution function ``F`` alone (docs/simulate.md has the derivation and the
worked example). With a proxy of timeout ``P`` and ``Q`` retries in front of the
provider, and ``p = 1 - F(P)`` the chance a try outlasts the proxy:

* try ``j`` (started at ``j * P``) exists when the ``j`` before it timed out at the
  proxy and the client still waits (``j * P < T``): ``J`` is the last such ``j``;
* an attempt bills ``g = sum_{j<=J} p**j`` generations and succeeds with
  ``s = sum_{j<=J} p**j * F(min(P, T - j * P))``;
* it fails with a 504 when every try timed out and the 504 comes before the
  client's timeout (``J == Q`` and ``(Q + 1) * P <= T``), otherwise with a timeout.

Without a proxy ``g = 1`` and ``s = F(T)``. Attempts then repeat geometrically:
an SDK call makes ``sum_{k<=R} c**k`` attempts (``c``: the chance an attempt fails
in a way the SDK retries), the application makes ``sum_{a<A} d**a`` SDK calls
(``d``: the chance a call fails in a way the application retries), and by Wald's
identity billed generations per business request are ``E[attempts] * g``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from payonce.simulate.config import RetryOn, StackConfig

__all__ = ["ClosedForm", "closed_form"]


@dataclass(frozen=True, slots=True)
class ClosedForm:
    """The exact expected figures for a configuration :func:`closed_form` can solve."""

    attempts_per_request: float
    billed_per_request: float
    duplicate_ratio: float
    success_rate: float | None  # None with payonce: it depends on the backoff's jitter


def closed_form(stack: StackConfig) -> ClosedForm | None:
    """The exact figures, or ``None`` when the configuration is not one of the simple cases.

    Solved: no faults (``failure_rate``, ``connect_failure_rate``), no deadline; and
    either no payonce, or payonce with no proxy below it (one generation per key).
    """
    if stack.failure_rate or stack.connect_failure_rate or stack.deadline is not None:
        return None
    if stack.payonce:
        if stack.proxy is not None and stack.proxy_below_payonce:
            return None
        # One generation per key, started by the first attempt; no faults release it.
        return ClosedForm(
            attempts_per_request=math.nan,
            billed_per_request=1.0,
            duplicate_ratio=0.0,
            success_rate=None,
        )
    generations, succeeds, fails_504 = _one_attempt(stack)
    fails_timeout = 1.0 - succeeds - fails_504
    sdk_continues = _share(stack.sdk_retry_on, fails_timeout, fails_504)
    retries = stack.sdk_retries
    attempts_per_call = sum(sdk_continues**k for k in range(retries + 1))
    # A call fails with class x on an attempt the SDK does not retry, or on its last.
    call_fails = {
        kind: rate
        * (sum(sdk_continues**k for k in range(retries)) * (not retried) + sdk_continues**retries)
        for kind, rate, retried in (
            ("timeout", fails_timeout, stack.sdk_retry_on.timeouts),
            ("5xx", fails_504, stack.sdk_retry_on.server_errors),
        )
    }
    app_continues = _share(stack.app_retry_on, call_fails["timeout"], call_fails["5xx"])
    calls = sum(app_continues**a for a in range(stack.app_attempts))
    call_succeeds = 1.0 - call_fails["timeout"] - call_fails["5xx"]
    attempts = attempts_per_call * calls
    billed = attempts * generations
    return ClosedForm(
        attempts_per_request=attempts,
        billed_per_request=billed,
        duplicate_ratio=(billed - 1.0) / billed,
        success_rate=call_succeeds * calls,
    )


def _one_attempt(stack: StackConfig) -> tuple[float, float, float]:
    """Generations billed, P(success) and P(504) of one SDK attempt."""
    latency, timeout, proxy = stack.latency, stack.timeout, stack.proxy
    if proxy is None:
        return 1.0, latency.cdf(timeout), 0.0
    outlasts = 1.0 - latency.cdf(proxy.timeout)
    last_try = proxy.retries if proxy.retry_on.timeouts else 0
    tries = [j for j in range(last_try + 1) if j * proxy.timeout < timeout]
    generations = sum(outlasts**j for j in tries)
    succeeds = sum(
        outlasts**j * latency.cdf(min(proxy.timeout, timeout - j * proxy.timeout)) for j in tries
    )
    all_tried = tries[-1] == last_try and (last_try + 1) * proxy.timeout <= timeout
    fails_504 = outlasts ** (last_try + 1) if all_tried else 0.0
    return generations, succeeds, fails_504


def _share(retry_on: RetryOn, timeout: float, server_error: float) -> float:
    return timeout * retry_on.timeouts + server_error * retry_on.server_errors
