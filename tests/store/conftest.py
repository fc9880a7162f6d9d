"""The store contract suite runs against every backend through this fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from payonce.clock import ManualClock
from payonce.store import MemoryStore, SQLiteStore, Store

BACKENDS: dict[str, Callable[[Path, ManualClock], Store]] = {
    "memory": lambda tmp, clock: MemoryStore(clock),
    "sqlite": lambda tmp, clock: SQLiteStore(str(tmp / "store.db"), clock, poll_interval=0.02),
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=sorted(BACKENDS))
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Store]:
    backend = BACKENDS[request.param](tmp_path, clock)
    yield backend
    await backend.close()
