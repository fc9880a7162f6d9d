"""Store failures at the gateway's edge: a fixed problem for callers, the cause for the operator.

Stores raise :class:`~payonce.errors.StorageError` in their own words: "Timeout
reading from 10.1.2.3:6379", "DB index is out of range", an SQLite file's path.
That tells anyone who can reach ``/_payonce/health`` (no credential needed)
where the store is and how it is set up, so it never reaches a response body.
Callers get :class:`~payonce.errors.StoreUnavailable` or
:class:`~payonce.errors.StoreTimeout` with a fixed detail they can match on;
the operator's log gets the store's message, once per distinct message and
``every`` seconds (an outage fails every request the same way, and one line per
request would bury the rest of the log), with the store URL's password, should a
client library ever quote it, replaced by ``***``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from urllib.parse import parse_qs, urlsplit

from payonce.clock import Clock
from payonce.errors import StorageError, StorageTimeout, StoreTimeout, StoreUnavailable

__all__ = ["StoreFailures", "public_problem"]

log = logging.getLogger("payonce.gateway")

# What callers are told: the same words whatever the store said.
UNAVAILABLE_DETAIL = (
    "the idempotency store cannot be reached; nothing was run. The gateway's log says why."
    " Retry later with the same Idempotency-Key"
)
TIMEOUT_DETAIL = (
    "the idempotency store did not answer in time; nothing was run. The gateway's log says"
    " why. Retry later with the same Idempotency-Key"
)
# Distinct messages remembered at most: a failure's message may carry a changing part
# (a cluster node's address), and the map must not grow with them.
_REMEMBERED = 64


def public_problem(error: StorageError) -> StoreUnavailable:
    """The problem a caller is answered for ``error``: its type and a fixed detail."""
    if isinstance(error, StorageTimeout):
        return StoreTimeout(TIMEOUT_DETAIL)
    return StoreUnavailable(UNAVAILABLE_DETAIL)


def _secrets_of(store_url: str) -> tuple[str, ...]:
    """The password of ``store_url`` (in its user info or its query), if it has one."""
    try:
        parts = urlsplit(store_url)
        found = [parts.password or ""]
    except ValueError:
        return ()
    found.extend(parse_qs(parts.query).get("password", []))
    return tuple(secret for secret in found if secret)


class StoreFailures:
    """Maps storage errors to problems and logs each distinct one once per ``every`` seconds."""

    def __init__(self, clock: Clock, store_url: str, *, every: float = 60.0) -> None:
        self._clock = clock
        self._every = every
        self._secrets = _secrets_of(store_url)
        # Message -> (when it was last logged, times it failed since without a line).
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def answer(self, error: StorageError) -> StoreUnavailable:
        """The problem for a caller; the store's own message goes to the log."""
        problem = public_problem(error)
        self.note(error, f"answered {problem.status} {problem.slug}")
        return problem

    def note(self, error: StorageError, what: str) -> None:
        """Log ``error`` for the operator, unless the same message was logged lately."""
        message = str(error) or error.__class__.__name__
        for secret in self._secrets:
            message = message.replace(secret, "***")
        now = self._clock.now()
        last = self._seen.get(message)
        if last is not None and now - last[0] < self._every:
            self._seen[message] = (last[0], last[1] + 1)
            return
        since = f" ({last[1]} more since the last line)" if last is not None and last[1] else ""
        self._seen[message] = (now, 0)
        self._seen.move_to_end(message)
        while len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        log.warning("the store failed, %s: %s%s", what, message, since)
