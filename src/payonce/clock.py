"""Time, injected. Leases and TTLs read a :class:`Clock`; tests advance a :class:`ManualClock`."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Wall-clock seconds since the epoch. Stores persist these, so they must be wall time."""

    def now(self) -> float: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to, so lease expiry is tested without sleeping."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward (or back, with a negative value, to model a clock jump)."""
        self._now += seconds
