"""One logical call as a state machine: the decisions, without any I/O.

Both transports drive a :class:`Call` the same way; only sending and sleeping
differ between them::

    start_attempt ─► send ─► answer < 400 ──────────────────────────► RETURN (success)
                          ├► PERMANENT error ───────────────────────► RETURN / RAISE
                          ├► AMBIGUOUS, unsafe method, gateway ─────► CHECK ─► stored ─► RETURN
                          │                                                 ├► 404 ─┐
                          │                                                 └► ? ───┤
                          ├► AMBIGUOUS, no gateway, resend off ─────► RAISE         │
                          └► NOT_SENT / REJECTED / AMBIGUOUS ─► attempts left? ◄────┘
                                                 budget allows? wait fits the deadline?
                                                   yes ─► RETRY(wait) ─► start_attempt
                                                   no ──► RETURN / RAISE the last error

A CHECK asks a payonce gateway about the key before anything is sent again
(docs/client.md, "What each failure proves"). It needs no attempt and no
budget: it sends nothing that could run. Its result decides what the failed
attempt becomes. While the answer is "running" it asks again, after a jittered
pause (:meth:`Call.check_pause`).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx2

from payonce.client._budget import RetryBudget
from payonce.client._classify import (
    ErrorClass,
    classify_exception,
    classify_status,
    retry_after_seconds,
)
from payonce.client._clock import RetryClock, zero_backoff_enabled
from payonce.client._history import Attempt, Outcome
from payonce.client._hooks import RetryDetails, RetryHook
from payonce.client._policy import RetryPolicy

__all__ = ["Action", "Call", "Lookup", "Step"]


class Action(enum.Enum):
    RETURN = "return"
    """Give the last response to the caller."""
    RAISE = "raise"
    """Raise the last exception, unchanged."""
    RETRY = "retry"
    """Sleep ``Step.wait`` seconds, then send again with the same key."""
    CHECK = "check"
    """Ask the gateway about the key, then call :meth:`Call.after_check`."""


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    wait: float = 0.0


class Lookup(enum.Enum):
    """What the gateway's status endpoint said about a key."""

    COMPLETED = "completed"
    """A stored result exists, and was fetched: it is the call's answer."""
    IN_PROGRESS = "in_progress"
    NOT_FOUND = "not_found"
    """Nobody runs the key: sending again with it is safe.

    Nothing ran; it failed and was released; or the gateway that ran it died
    and its lease lapsed (the status document's ``abandoned``).
    """
    UNKNOWN = "unknown"
    """The check itself failed, or the deadline came while the call still ran."""
    NO_GATEWAY = "no_gateway"
    """The server is no payonce gateway (it does not know the status endpoint):
    re-sending is as safe as the server makes it, so only if the policy re-sends
    ambiguous failures."""


@dataclass(slots=True)
class _Failure:
    error_class: ErrorClass
    status_code: int | None
    error: BaseException | None
    retry_after: float | None
    budget_allows: bool
    is_response: bool


class Call:
    """The state of one logical call: its key, deadline, attempts and history."""

    def __init__(
        self,
        *,
        policy: RetryPolicy,
        budget: RetryBudget | None,
        clock: RetryClock,
        hooks: Sequence[RetryHook],
        rng: random.Random | None,
        method: str,
        url: str,
        key: str | None,
        gateway: bool,
        wall_now: float,
    ) -> None:
        self.policy = policy
        self.budget = budget
        self.clock = clock
        self.hooks = hooks
        self.rng = rng
        self.method = method
        self.url = url
        self.key = key
        self.gateway = gateway
        self._wall_offset = wall_now - clock.now()
        self.started = clock.now()
        self.deadline_at = self.started + policy.deadline
        self.attempt = 0
        self._attempt_started = self.started
        self.history: list[Attempt] = []
        self._pending: _Failure | None = None

    # -- time ---------------------------------------------------------------

    def time_left(self) -> float:
        return self.deadline_at - self.clock.now()

    def attempt_timeouts(self, requested: Mapping[str, float | None] | None) -> dict[str, float]:
        """httpx2 ``timeout`` extension for the next attempt: policy, request and deadline."""
        left = max(self.time_left(), 0.001)
        policy = self.policy

        def cut(name: str, value: float) -> float:
            asked = requested.get(name) if requested else None
            value = min(value, left)
            return min(value, asked) if asked is not None else value

        return {
            "connect": cut("connect", policy.connect_timeout),
            "read": cut("read", policy.read_timeout),
            "write": cut("write", policy.read_timeout),
            "pool": cut("pool", policy.connect_timeout),
        }

    def check_wait(self) -> float:
        """Seconds to long-poll the status endpoint: what is left, less a margin for the reply."""
        left = self.time_left()
        return max(0.0, min(self.policy.status_wait, left - min(1.0, left * 0.2)))

    def check_pause(self, check: int) -> float | None:
        """Seconds to pause after status check ``check`` said "running"; ``None``: stop asking.

        :meth:`RetryPolicy.status_pause` (full jitter); ``None`` when the pause
        would reach the deadline, where no further check could tell anything new.
        """
        pause = 0.0 if zero_backoff_enabled() else self.policy.status_pause(check, self.rng)
        return pause if pause < self.time_left() else None

    # -- events -------------------------------------------------------------

    def start_attempt(self) -> None:
        self.attempt += 1
        self._attempt_started = self.clock.now()

    def on_response(self, status: int, headers: httpx2.Headers, body: bytes) -> Step:
        """An answer arrived (``body`` is its decoded content, needed only for errors)."""
        error_class = classify_status(status, headers, body)
        if error_class is None:
            if self.budget is not None:
                self.budget.record_success()
            self._record(Outcome.SUCCESS, None, status, None)
            return Step(Action.RETURN)
        retry_after = retry_after_seconds(headers, self.clock.now() + self._wall_offset)
        return self._failed(error_class, status, None, retry_after, is_response=True)

    def on_error(self, exc: httpx2.TransportError) -> Step:
        """The inner transport raised."""
        return self._failed(classify_exception(exc), None, exc, None, is_response=False)

    def after_check(self, lookup: Lookup) -> Step:
        """The gateway answered the CHECK; ``COMPLETED`` means its stored response is returned."""
        failure = self._pending
        assert failure is not None, "after_check() without a CHECK"
        self._pending = None
        if lookup is Lookup.COMPLETED:
            if self.budget is not None:
                self.budget.record_success()
            self._record(Outcome.RECOVERED, failure.error_class, failure.status_code, failure.error)
            return Step(Action.RETURN)
        if lookup is Lookup.NO_GATEWAY and not self.policy.resend_ambiguous:
            return self._give_up(failure)
        # Not found (nothing ran, or it failed and was released) or unknown: sending again
        # with the same key is safe, because the gateway runs a key at most once.
        return self._retry_or_give_up(failure)

    @property
    def history_tuple(self) -> tuple[Attempt, ...]:
        return tuple(self.history)

    # -- decisions ----------------------------------------------------------

    def _failed(
        self,
        error_class: ErrorClass,
        status: int | None,
        exc: BaseException | None,
        retry_after: float | None,
        *,
        is_response: bool,
    ) -> Step:
        if not error_class.retryable:
            self._record(Outcome.FAILURE, error_class, status, exc)
            return Step(Action.RETURN if is_response else Action.RAISE)
        allows = True if self.budget is None else self.budget.record_failure_and_allow_retry()
        failure = _Failure(error_class, status, exc, retry_after, allows, is_response)
        if error_class is ErrorClass.AMBIGUOUS and self.key is not None:
            if self.gateway:
                self._pending = failure
                return Step(Action.CHECK)
            if not self.policy.resend_ambiguous:
                return self._give_up(failure)
        return self._retry_or_give_up(failure)

    def _retry_or_give_up(self, failure: _Failure) -> Step:
        if self.attempt >= self.policy.attempts:
            return self._give_up(failure)
        if not failure.budget_allows:
            return self._give_up(failure, budget_exhausted=True)
        if zero_backoff_enabled():
            wait = 0.0
        else:
            wait = max(self.policy.backoff(self.attempt, self.rng), failure.retry_after or 0.0)
        if wait >= self.time_left():
            # Honouring Retry-After (or the backoff) would end past the deadline: a retry
            # then could not even start. Give up now rather than sleep for nothing.
            return self._give_up(failure)
        self._record(Outcome.RETRIED, failure.error_class, failure.status_code, failure.error, wait)
        return Step(Action.RETRY, wait)

    def _give_up(self, failure: _Failure, *, budget_exhausted: bool = False) -> Step:
        self._record(
            Outcome.FAILURE,
            failure.error_class,
            failure.status_code,
            failure.error,
            budget_exhausted=budget_exhausted,
        )
        return Step(Action.RETURN if failure.is_response else Action.RAISE)

    def _record(
        self,
        outcome: Outcome,
        error_class: ErrorClass | None,
        status: int | None,
        exc: BaseException | None,
        wait: float = 0.0,
        *,
        budget_exhausted: bool = False,
    ) -> None:
        now = self.clock.now()
        self.history.append(
            Attempt(
                number=self.attempt,
                started=self._attempt_started - self.started,
                duration=now - self._attempt_started,
                outcome=outcome,
                error_class=error_class,
                status_code=status,
                error=repr(exc) if exc is not None else None,
                wait=wait,
            )
        )
        details = RetryDetails(
            method=self.method,
            url=self.url,
            idempotency_key=self.key,
            attempt=self.attempt,
            outcome=outcome,
            error_class=error_class,
            status_code=status,
            error=exc,
            wait=wait,
            elapsed=now - self.started,
            budget_exhausted=budget_exhausted,
            gateway=self.gateway,
        )
        for hook in self.hooks:
            hook(details)
