"""Error classes: what a failed attempt proves about the request, and so what to do.

============  =========================================  ======================================
class         what failed                                decision
============  =========================================  ======================================
NOT_SENT      connect error (DNS included), connect      retry with backoff: nothing reached
              timeout, pool timeout, proxy refused       the server
REJECTED      429, 503, 529, 408, 409, or any status     retry after ``Retry-After``: refused
              with ``x-should-retry: true``              before any work
AMBIGUOUS     read or write timeout, connection lost     never re-send blind: ask a payonce
              after sending, 500, 502, 504, other 5xx    gateway first; elsewhere re-send only
                                                         with the same key
PERMANENT     400, 401, 403, 404, 413, 422, other 4xx,   answer (or raise) at once
              501, 505, context-length and
              content-policy errors,
              ``x-should-retry: false``
============  =========================================  ======================================

The exception half follows httpx's tree (REFERENCE.md, "Which errors prove the
request was not sent"). 409 is a payonce gateway's "the same key is still
running" and OpenAI's lock timeout: nothing new ran, and the same key joins the
running call. Safe methods (GET, HEAD, OPTIONS, TRACE) are re-sent after an
ambiguous failure without asking: repeating them is harmless (RFC 9110, 9.2.1).
"""

from __future__ import annotations

import enum

import httpx2

from payonce.retry_after import retry_after_seconds

__all__ = [
    "ErrorClass",
    "classify_exception",
    "classify_status",
    "retry_after_seconds",
    "should_retry_header",
]


class ErrorClass(enum.Enum):
    """What one failed attempt proves, in increasing doubt."""

    NOT_SENT = "not_sent"
    REJECTED = "rejected"
    AMBIGUOUS = "ambiguous"
    PERMANENT = "permanent"

    @property
    def retryable(self) -> bool:
        return self is not ErrorClass.PERMANENT


_REJECTED = frozenset({408, 409, 429, 503, 529})
_PERMANENT_5XX = frozenset({501, 505})
# Provider error codes and messages that no retry can fix, whatever the status says.
_PERMANENT_MARKERS = (
    b"context_length_exceeded",
    b"maximum context length",
    b"prompt is too long",
    b"content_policy_violation",
    b"content_filter",
)


def classify_exception(exc: httpx2.TransportError) -> ErrorClass:
    """The class of a transport error raised by httpx2."""
    if isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout | httpx2.PoolTimeout):
        return ErrorClass.NOT_SENT
    if isinstance(exc, httpx2.ProxyError):
        return ErrorClass.NOT_SENT  # the proxy refused the tunnel; the origin saw nothing
    if isinstance(exc, httpx2.UnsupportedProtocol | httpx2.LocalProtocolError):
        return ErrorClass.PERMANENT  # our own request is unsendable; sending again won't help
    # ReadTimeout, WriteTimeout, ReadError, WriteError, RemoteProtocolError, CloseError:
    # the request (or part of it) left, and the server may have run it.
    return ErrorClass.AMBIGUOUS


def classify_status(status: int, headers: httpx2.Headers, body: bytes) -> ErrorClass | None:
    """The class of an HTTP answer, or ``None`` for one that is not an error (< 400).

    ``body`` is the decoded error body (or its beginning); it is only searched
    for the permanent markers (context length, content policy).
    """
    if status < 400:
        return None
    should_retry = should_retry_header(headers)
    if should_retry is False:
        return ErrorClass.PERMANENT
    lowered = body[:65536].lower()
    if any(marker in lowered for marker in _PERMANENT_MARKERS):
        return ErrorClass.PERMANENT
    if status in _REJECTED:
        return ErrorClass.REJECTED
    if status >= 500 and status not in _PERMANENT_5XX:
        return ErrorClass.AMBIGUOUS
    # A server may ask for a retry of a status we would not retry (x-should-retry: true).
    return ErrorClass.REJECTED if should_retry else ErrorClass.PERMANENT


def should_retry_header(headers: httpx2.Headers) -> bool | None:
    """``x-should-retry`` (sent by OpenAI, Anthropic and payonce): True, False or absent."""
    value = headers.get("x-should-retry", "").strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None
