"""The retry budget: a token bucket in the style of gRPC retry throttling.

gRPC (``retryThrottling``, gRFC A6): the bucket starts full with ``max_tokens``;
each failed attempt that could be retried removes one token, each successful
call adds ``token_ratio``; a retry is allowed only while the bucket holds more
than half of ``max_tokens``. While failures outnumber successes by more than
``1 / token_ratio``, the bucket drains and only first attempts are sent, so an
outage costs at most about ``(1 + token_ratio) *`` the calls, plus the
``max_tokens / 2`` retries a full bucket allows (its floor).
"""

from __future__ import annotations

import threading

__all__ = ["RetryBudget"]


class RetryBudget:
    """Shared by every call of a transport (or of several, if you pass one to each).

    Thread-safe; the async transport uses it without awaiting while it holds the lock.
    """

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        self.max_tokens = max_tokens
        self.token_ratio = token_ratio
        self._tokens = max_tokens
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        """Tokens in the bucket now."""
        return self._tokens

    @property
    def floor(self) -> float:
        """Retries a full bucket allows before the first success: ``max_tokens / 2``."""
        return self.max_tokens / 2

    def record_success(self) -> None:
        """A call got an answer it keeps: give back ``token_ratio`` of a token."""
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def record_failure_and_allow_retry(self) -> bool:
        """A retryable attempt failed: take a token, then say whether a retry may follow.

        One atomic step, so that concurrent failures cannot all pass the check
        before any of them has paid.
        """
        with self._lock:
            self._tokens = max(0.0, self._tokens - 1.0)
            return self._tokens > self.max_tokens / 2
