"""The retry policy: an immutable value, checked when it is built.

The defaults follow the incident this project started from (docs/client.md, "The policy"):
a short connect timeout, a long read timeout, three attempts, one overall
deadline of two minutes, exponential backoff with full jitter, and a retry
budget so that retries cannot multiply the load of an overloaded upstream.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from payonce.errors import ConfigError

__all__ = ["RetryPolicy", "stacked_attempts"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one logical call is retried.

    Bounded by ``attempts`` *and* by ``deadline`` (whichever comes first), like
    stamina. The policy holds no state: each call keeps its own attempt history,
    and the retry budget (:class:`~payonce.client.RetryBudget`) is shared by the
    calls of one transport.

    **Backoff** before retry *n* (1 for the first retry) is full jitter
    (AWS Architecture Blog, "Exponential Backoff And Jitter")::

        wait(n) = uniform(0, min(backoff_max, backoff_initial * 2 ** (n - 1)))

    A ``retry-after-ms`` header (milliseconds) or, failing that, ``Retry-After``
    (seconds or an HTTP date) raises the wait to at least what the server asked
    for. A wait that would end past the deadline is not taken: the call gives up
    at once and raises its last error.

    **Timeouts.** Each attempt connects within ``connect_timeout`` and waits at
    most ``read_timeout`` for each read; both are cut to the time left before
    the deadline, and to a smaller timeout set on the request itself.

    **Budget.** ``budget_tokens`` and ``budget_ratio`` shape a token bucket in the
    style of gRPC retry throttling: each failed attempt that could be retried
    takes a token, each successful call gives back ``budget_ratio`` of one, and
    retries stop while the bucket holds half its tokens or fewer. In steady state
    retries stop once more than about ``budget_ratio`` (10%) of recent calls
    needed one. ``budget_tokens=None`` switches the budget off.

    **Ambiguous failures** (read timeout, connection lost after sending, 500,
    502, 504): against a payonce gateway the client asks the gateway what
    happened before sending again; elsewhere it re-sends with the same
    ``Idempotency-Key`` when ``resend_ambiguous`` is true (the default), and
    raises at once when it is false (for an upstream that ignores keys, where a
    re-send may be billed twice).

    **Status checks** long-poll the gateway for up to ``status_wait`` seconds at
    a time; between two answers that say the call still runs, the client pauses
    for :meth:`status_pause` (full jitter from ``status_backoff_initial`` up to
    ``status_backoff_max``), never past the deadline.
    """

    attempts: int = 3
    deadline: float = 120.0
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    backoff_initial: float = 0.5
    backoff_max: float = 8.0
    budget_tokens: float | None = 10.0
    budget_ratio: float = 0.1
    resend_ambiguous: bool = True
    status_wait: float = 30.0
    """Longest single long-poll (``?wait=``) on the gateway's status endpoint (at most 300)."""
    status_backoff_initial: float = 0.1
    """First ceiling of the jittered pause between two status checks (see :meth:`status_pause`)."""
    status_backoff_max: float = 2.0
    """Largest ceiling of the pause between two status checks."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        for name in ("deadline", "connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if not value > 0 or math.isinf(value):
                raise ConfigError(f"RetryPolicy.{name} must be a positive number, got {value}")
        for name in (
            "backoff_initial",
            "backoff_max",
            "budget_ratio",
            "status_backoff_initial",
            "status_backoff_max",
        ):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ConfigError(f"RetryPolicy.{name} must be 0 or more, got {value}")
        if self.budget_tokens is not None and not 1 <= self.budget_tokens < math.inf:
            raise ConfigError(
                f"RetryPolicy.budget_tokens must be at least 1 or None, got {self.budget_tokens}"
            )
        if not 0 <= self.status_wait <= 300:
            raise ConfigError(
                f"RetryPolicy.status_wait must be between 0 and 300, got {self.status_wait}"
            )

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """The jittered wait before retry number ``retry`` (1-based), without ``Retry-After``."""
        ceiling = min(self.backoff_max, self.backoff_initial * 2.0 ** max(retry - 1, 0))
        return (rng or random).uniform(0.0, ceiling)

    def status_pause(self, check: int, rng: random.Random | None = None) -> float:
        """The jittered pause after status check number ``check`` (1-based) said "running".

        Full jitter, like :meth:`backoff`, on its own shorter scale::

            pause(n) = uniform(0, min(status_backoff_max, status_backoff_initial * 2 ** (n - 1)))

        (0.1 s doubling to 2 s by default). Each check is a long-poll that a
        gateway answers when the record changes, so a pause is usually not
        needed; it bounds the rate when answers come back at once anyway (a
        stream recording events, an older gateway, a proxy that cuts long
        requests short). The caller cuts it to the call's deadline.
        """
        ceiling = min(
            self.status_backoff_max, self.status_backoff_initial * 2.0 ** max(check - 1, 0)
        )
        return (rng or random).uniform(0.0, ceiling)

    def worst_case_attempts(self, *other_layers: int) -> int:
        """Most requests one logical call can send, with these other layers stacked on it.

        ``other_layers`` are the attempt counts of the retry loops around (or
        under) this one: an application loop of 3 and an SDK with
        ``max_retries=2`` (3 attempts) give ``policy.worst_case_attempts(3, 3)``,
        27 with the default policy. See :func:`stacked_attempts`.
        """
        return stacked_attempts(self.attempts, *other_layers)


def stacked_attempts(*layers: int) -> int:
    """Stacked retry layers multiply: ``N = a_1 * a_2 * ... * a_k`` requests at worst.

    Each ``a_i`` is the number of *attempts* (retries + 1) of one layer. A layer
    that retries only what provably never left (a payonce gateway's connect
    retries) counts as 1 for what reaches the provider. With an idempotency key
    sent through a payonce gateway, the provider still runs the call at most
    once per key; without one, every one of the ``N`` requests can be billed.
    """
    total = 1
    for attempts in layers:
        if attempts < 1:
            raise ConfigError(f"a retry layer has at least 1 attempt, got {attempts}")
        total *= attempts
    return total
