"""The probe finds a follower in another process without the writer writing.

Two SQLite stores on one file stand for two gateways: the owner's process runs
the probe over its quiet stream, the follower's waits on the record as a
gateway relaying another's run does. No event is appended meanwhile: the probe
alone must tell the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from payonce.clock import ManualClock
from payonce.errors import StorageError
from payonce.gateway.watch_probe import WatchProbe, probe_for
from payonce.store import SQLiteStore, Store
from tests.support.following import following, running_stream


class _Writer:
    def __init__(self) -> None:
        self.told = asyncio.Event()

    def now_watched(self) -> None:
        self.told.set()


class _FailingOnce(SQLiteStore):
    """Cannot answer the probe's first question (a lock held elsewhere, say)."""

    failed = False

    async def watched_runs(self, runs: object) -> set[tuple[str, str]]:
        if not self.failed:
            self.failed = True
            raise StorageError("SQLite store failed: database is locked")
        return await super().watched_runs(runs)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def _stores(
    path: Path, owner_type: type[SQLiteStore] = SQLiteStore
) -> AsyncIterator[tuple[Store, Store]]:
    clock = ManualClock()
    owner = owner_type(str(path), clock, poll_interval=0.02)
    follower = SQLiteStore(str(path), clock, poll_interval=0.02)
    try:
        yield owner, follower
    finally:
        await owner.close()
        await follower.close()


@pytest.mark.parametrize("owner_type", [SQLiteStore, _FailingOnce])
async def test_a_follower_elsewhere_is_found_without_a_write(
    tmp_path: Path, owner_type: type[SQLiteStore]
) -> None:
    async with _stores(tmp_path / "shared.db", owner_type) as (owner, follower):
        await running_stream(owner, "k")
        await running_stream(owner, "alone")
        probe = WatchProbe(owner)
        followed, alone = _Writer(), _Writer()
        probe.add("t", "k", followed)
        probe.add("t", "alone", alone)
        async with following(follower, "k"):
            # 10 s only catches a stall: the probe asks every 0.25 s.
            await asyncio.wait_for(followed.told.wait(), timeout=10)
        assert not alone.told.is_set()
        assert len(probe) == 1  # the found one is asked about no more


async def test_a_discarded_stream_is_not_asked_about_and_the_probe_stops(tmp_path: Path) -> None:
    async with _stores(tmp_path / "shared.db") as (owner, follower):
        await running_stream(owner, "k")
        probe = WatchProbe(owner)
        writer = _Writer()
        probe.add("t", "k", writer)
        probe.discard("t", "k", _Writer())  # another run's writer: not this one
        assert len(probe) == 1
        probe.discard("t", "k", writer)
        assert len(probe) == 0
        async with following(follower, "k"):
            await asyncio.sleep(0.6)
        assert not writer.told.is_set()


async def test_one_probe_per_store(tmp_path: Path) -> None:
    async with _stores(tmp_path / "shared.db") as (owner, follower):
        assert probe_for(owner) is probe_for(owner)
        assert probe_for(owner) is not probe_for(follower)
