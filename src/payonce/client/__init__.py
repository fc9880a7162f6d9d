"""The payonce client: retry by error class, one key per call, ask before re-sending.

::

    import openai
    from payonce.client import RetryPolicy, protect

    client = protect(openai.OpenAI(base_url="http://127.0.0.1:8080/v1"), policy=RetryPolicy())

Or below any httpx2 client::

    httpx2.Client(transport=IdempotentTransport(policy=RetryPolicy(attempts=3)))

or httpx client (``HttpxTransport(httpx.HTTPTransport(), policy=...)``, and its
async twin ``AsyncHttpxTransport``: the same policy, bridged).

The pieces: :class:`RetryPolicy` (an immutable value: attempts, deadline,
timeouts, backoff, budget), :class:`ErrorClass` (what a failure proves),
:class:`IdempotentTransport` / :class:`AsyncIdempotentTransport` (the policy
around any httpx2 transport), :func:`protect` (the official SDKs),
:class:`RetryHook` / :class:`RetryDetails` (instrumentation),
:func:`attempt_history` (what happened to a call). Tests use
:mod:`payonce.testing` so they never sleep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import httpx2 as _httpx2  # noqa: F401 - the optional dependency, checked once
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("payonce.client needs httpx2: pip install 'payonce[client]'") from exc

from payonce.client._async_transport import AsyncIdempotentTransport
from payonce.client._budget import RetryBudget
from payonce.client._classify import ErrorClass, classify_exception, classify_status
from payonce.client._clock import RetryClock, SystemRetryClock
from payonce.client._history import Attempt, Outcome, attempt_history
from payonce.client._hooks import (
    LoggingHook,
    PrometheusHook,
    RetryDetails,
    RetryHook,
    default_hooks,
)
from payonce.client._policy import RetryPolicy, stacked_attempts
from payonce.client._protect import protect
from payonce.client._scenario import scenario
from payonce.client._transport import IdempotentTransport

if TYPE_CHECKING:
    from payonce.client._httpx import AsyncHttpxTransport, HttpxTransport

__all__ = [
    "AsyncHttpxTransport",
    "AsyncIdempotentTransport",
    "Attempt",
    "ErrorClass",
    "HttpxTransport",
    "IdempotentTransport",
    "LoggingHook",
    "Outcome",
    "PrometheusHook",
    "RetryBudget",
    "RetryClock",
    "RetryDetails",
    "RetryHook",
    "RetryPolicy",
    "SystemRetryClock",
    "attempt_history",
    "classify_exception",
    "classify_status",
    "default_hooks",
    "protect",
    "scenario",
    "stacked_attempts",
]


def __getattr__(name: str) -> Any:
    # The httpx (not httpx2) transports import httpx, which payonce does not depend
    # on: only when asked for (an SDK built on httpx has it installed).
    if name in ("HttpxTransport", "AsyncHttpxTransport"):
        from payonce.client import _httpx

        return getattr(_httpx, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
