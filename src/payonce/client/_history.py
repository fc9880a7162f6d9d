"""The attempt history of one call, attached to whatever the call finally gives back.

A call ends in one of two ways, and both carry the history:

* an exception (the last attempt's httpx2 error, raised unchanged): in its
  ``payonce_attempts`` attribute, and as a note (PEP 678) in its traceback;
* a response (success, or the last error response): in
  ``response.extensions["payonce_attempts"]``.

:func:`attempt_history` finds it on either, and through the SDKs' wrappers
(``openai.APITimeoutError`` chains the httpx2 error as ``__cause__``;
``APIStatusError.response`` is the httpx2 response).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import httpx2

from payonce.client._classify import ErrorClass

__all__ = ["Attempt", "Outcome", "attach_to_exception", "attach_to_response", "attempt_history"]

EXTENSION = "payonce_attempts"


class Outcome(enum.Enum):
    """What became of one attempt (the ``outcome`` label of the attempts metric)."""

    SUCCESS = "success"
    """Its answer was given to the caller and is not an error (status below 400)."""
    FAILURE = "failure"
    """Its error (status or exception) was given to the caller: permanent, or retries ran out."""
    RETRIED = "retried"
    """It failed and another attempt followed."""
    RECOVERED = "recovered"
    """It failed ambiguously, and the gateway's stored result was given to the caller."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One request sent for a call, and what came of it."""

    number: int
    """1 for the first attempt."""
    started: float
    """Seconds from the start of the call."""
    duration: float
    outcome: Outcome
    error_class: ErrorClass | None = None
    status_code: int | None = None
    error: str | None = None
    """``repr()`` of the exception, for attempts that raised one."""
    wait: float = 0.0
    """Seconds waited after this attempt, before the next one."""


def attach_to_exception(exc: BaseException, history: tuple[Attempt, ...]) -> None:
    """Attach the history to the exception the caller will see, and note it in the traceback."""
    exc.payonce_attempts = history  # type: ignore[attr-defined]
    exc.add_note(f"payonce: gave up after {_summary(history)}")


def attach_to_response(response: httpx2.Response, history: tuple[Attempt, ...]) -> None:
    """Attach the history to the response given back to the caller."""
    response.extensions[EXTENSION] = history


def attempt_history(value: object) -> tuple[Attempt, ...]:
    """The attempts behind a response or an exception, or ``()`` if it has none.

    Accepts an httpx2 response, an exception raised by a payonce transport, or an
    SDK exception wrapping either (via ``.response`` or the ``__cause__`` chain).
    """
    seen: set[int] = set()
    current: object = value
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, httpx2.Response) or _is_httpx_response(current):
            history = getattr(current, "extensions", {}).get(EXTENSION)
            return history if isinstance(history, tuple) else ()
        found = getattr(current, "payonce_attempts", None)
        if isinstance(found, tuple):
            return found
        response = getattr(current, "response", None)
        if isinstance(response, httpx2.Response) or _is_httpx_response(response):
            history = getattr(response, "extensions", {}).get(EXTENSION)
            if isinstance(history, tuple):
                return history
        if isinstance(current, BaseException):
            current = current.__cause__ or current.__context__
        else:
            break
    return ()


def _is_httpx_response(value: object) -> bool:
    # An httpx (not httpx2) response, from protect() on an SDK built on httpx:
    # payonce does not import httpx to ask.
    kind = type(value)
    return kind.__name__ == "Response" and kind.__module__.split(".")[0] == "httpx"


def _summary(history: tuple[Attempt, ...]) -> str:
    parts = []
    for attempt in history:
        what = attempt.error or f"HTTP {attempt.status_code}"
        parts.append(f"#{attempt.number} {what} -> {attempt.outcome.value}")
    noun = "attempt" if len(history) == 1 else "attempts"
    return f"{len(history)} {noun}: " + "; ".join(parts)
