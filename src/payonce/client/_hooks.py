"""Instrumentation: a :class:`RetryHook` receives a frozen :class:`RetryDetails` per attempt.

The default hooks are :class:`LoggingHook` and, when ``prometheus-client`` is
installed (``pip install 'payonce[prometheus]'``), :class:`PrometheusHook` with
three counters:

* ``payonce_client_attempts_total{outcome}``: every request sent, by
  :class:`~payonce.client.Outcome` (``success``, ``failure``, ``retried``,
  ``recovered``);
* ``payonce_client_retries_total{reason}``: every retry, by the
  :class:`~payonce.client.ErrorClass` that caused it (``not_sent``,
  ``rejected``, ``ambiguous``);
* ``payonce_client_budget_exhausted_total``: retries the retry budget refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from payonce.client._classify import ErrorClass
from payonce.client._history import Outcome

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "LoggingHook",
    "PrometheusHook",
    "RetryDetails",
    "RetryHook",
    "default_hooks",
    "prometheus_available",
]

log = logging.getLogger("payonce.client")


@dataclass(frozen=True, slots=True)
class RetryDetails:
    """What one attempt of a call did and what the policy decided next."""

    method: str
    url: str
    """Without the query string, which may hold secrets."""
    idempotency_key: str | None
    attempt: int
    """The attempt that just ended (1-based)."""
    outcome: Outcome
    error_class: ErrorClass | None
    status_code: int | None
    error: BaseException | None
    wait: float
    """Seconds before the next attempt (0 unless ``outcome`` is ``RETRIED``)."""
    elapsed: float
    """Seconds since the call started."""
    budget_exhausted: bool = False
    """True when this attempt was not retried because the retry budget was empty."""
    gateway: bool = False
    """True when the server is known to be a payonce gateway."""


class RetryHook(Protocol):
    """Called once per attempt, after the policy has decided what follows it."""

    def __call__(self, details: RetryDetails) -> None: ...


def _describe(details: RetryDetails) -> str:
    if details.error is not None:
        return f"{type(details.error).__name__}: {details.error}"
    return f"HTTP {details.status_code}"


class LoggingHook:
    """Logs to ``payonce.client``: retries and failures at WARNING, the rest at DEBUG."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or log

    def __call__(self, details: RetryDetails) -> None:
        key = details.idempotency_key
        where = f"{details.method} {details.url} (Idempotency-Key {key!r})"
        if details.outcome is Outcome.RETRIED:
            self.logger.warning(
                "attempt %d of %s failed (%s, %s); retrying in %.3fs",
                details.attempt,
                where,
                _describe(details),
                details.error_class.value if details.error_class else "?",
                details.wait,
            )
        elif details.outcome is Outcome.FAILURE and details.error_class is not None:
            budget = "; retry budget exhausted" if details.budget_exhausted else ""
            self.logger.warning(
                "attempt %d of %s failed (%s, %s); giving up%s",
                details.attempt,
                where,
                _describe(details),
                details.error_class.value,
                budget,
            )
        elif details.outcome is Outcome.RECOVERED:
            self.logger.info(
                "attempt %d of %s failed (%s); its result was fetched from the gateway",
                details.attempt,
                where,
                _describe(details),
            )
        else:
            self.logger.debug("attempt %d of %s: %s", details.attempt, where, _describe(details))


def prometheus_available() -> bool:
    """Whether ``prometheus_client`` can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


# One set of counters per registry: prometheus_client refuses a second registration.
_COUNTERS: dict[int, tuple[Any, Any, Any]] = {}


class PrometheusHook:
    """Counts attempts, retries and budget refusals in a Prometheus registry.

    ``registry`` defaults to ``prometheus_client.REGISTRY``; hooks sharing a
    registry share its counters.
    """

    def __init__(self, registry: Any = None) -> None:
        import prometheus_client

        registry = registry if registry is not None else prometheus_client.REGISTRY
        counters = _COUNTERS.get(id(registry))
        if counters is None:
            counters = (
                prometheus_client.Counter(
                    "payonce_client_attempts",
                    "Requests sent by payonce clients, by what became of them.",
                    ["outcome"],
                    registry=registry,
                ),
                prometheus_client.Counter(
                    "payonce_client_retries",
                    "Retries by payonce clients, by the error class that caused them.",
                    ["reason"],
                    registry=registry,
                ),
                prometheus_client.Counter(
                    "payonce_client_budget_exhausted",
                    "Retries refused because the retry budget was exhausted.",
                    registry=registry,
                ),
            )
            _COUNTERS[id(registry)] = counters
        self._attempts: Any = counters[0]
        self._retries: Any = counters[1]
        self._budget_exhausted: Any = counters[2]

    def __call__(self, details: RetryDetails) -> None:
        self._attempts.labels(outcome=details.outcome.value).inc()
        if details.outcome is Outcome.RETRIED and details.error_class is not None:
            self._retries.labels(reason=details.error_class.value).inc()
        if details.budget_exhausted:
            self._budget_exhausted.inc()


def default_hooks() -> Sequence[RetryHook]:
    """:class:`LoggingHook`, plus :class:`PrometheusHook` when prometheus-client is installed."""
    hooks: list[RetryHook] = [LoggingHook()]
    if prometheus_available():
        hooks.append(PrometheusHook())
    return tuple(hooks)
