"""Time for the client, injected: a monotonic ``now`` and the two ways to sleep.

Deadlines are measured on a monotonic clock, unlike the wall-clock
:class:`payonce.clock.Clock` of the stores, because a call's deadline must not
move when the system clock is stepped. :mod:`payonce.testing` has a manual
implementation whose ``sleep`` advances time instead of waiting, and the
zero-backoff switch that turns every computed wait into 0.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio

__all__ = ["RetryClock", "SystemRetryClock", "set_zero_backoff", "zero_backoff_enabled"]


class RetryClock(Protocol):
    """Monotonic seconds, and sleeping for the sync and the async transport."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    async def sleep_async(self, seconds: float) -> None: ...


class SystemRetryClock:
    """The real clock: :func:`time.monotonic`, :func:`time.sleep` and :func:`anyio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def sleep_async(self, seconds: float) -> None:
        # anyio, not asyncio: httpx2's async transports also run under trio.
        await anyio.sleep(seconds)


_zero_backoff = False


def set_zero_backoff(enabled: bool) -> None:
    """Process-wide testing switch (see :mod:`payonce.testing`): every wait becomes 0."""
    global _zero_backoff  # one switch for the whole process, like stamina's
    _zero_backoff = enabled


def zero_backoff_enabled() -> bool:
    """Whether :func:`set_zero_backoff` is on."""
    return _zero_backoff
