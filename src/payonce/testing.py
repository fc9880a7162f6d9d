"""Helpers for testing code that uses :mod:`payonce.client`, without ever sleeping.

Two tools, as stamina offers:

* :func:`zero_backoff` (a context manager) or :func:`set_zero_backoff`: every
  wait the policy computes, backoff, ``Retry-After`` and pauses between status
  checks alike, becomes 0.
  Attempts, budget and error classes behave as in production.
* :class:`ManualClock`: a :class:`~payonce.client.RetryClock` whose ``sleep``
  advances it instead of waiting, so waits and deadlines can be asserted::

      clock = ManualClock()
      transport = IdempotentTransport(httpx2.MockTransport(handler), clock=clock)
      ...
      assert clock.slept == [1.0, 1.0]   # Retry-After: 1 honoured twice
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from payonce.client._clock import set_zero_backoff, zero_backoff_enabled
from payonce.clock import ManualClock as _ManualWallClock

__all__ = ["ManualClock", "set_zero_backoff", "zero_backoff", "zero_backoff_enabled"]


class ManualClock(_ManualWallClock):
    """A clock that moves only when told to, or when the client sleeps on it.

    ``slept`` lists every sleep, in order.
    """

    def __init__(self, start: float = 1_000.0) -> None:
        super().__init__(start)
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)


@contextlib.contextmanager
def zero_backoff() -> Iterator[None]:
    """Within the block, the client never waits between attempts."""
    before = zero_backoff_enabled()
    set_zero_backoff(True)
    try:
        yield
    finally:
        set_zero_backoff(before)
