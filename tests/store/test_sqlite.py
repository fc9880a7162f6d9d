"""SQLite specifics: durability across reopen, bad paths and files."""

from __future__ import annotations

from pathlib import Path

import pytest

from payonce.clock import ManualClock
from payonce.errors import ConfigError
from payonce.store import ClaimStatus, SQLiteStore, StoredResponse, open_store


async def test_completed_records_survive_reopening(tmp_path: Path) -> None:
    clock = ManualClock()
    first = SQLiteStore(str(tmp_path / "p.db"), clock)
    claim = await first.claim("t", "k", "fp", lease=30, ttl=3600)
    await first.complete("t", "k", claim.record.token, StoredResponse(200, (), b"x"))
    await first.close()
    second = SQLiteStore(str(tmp_path / "p.db"), clock)
    again = await second.claim("t", "k", "fp", lease=30, ttl=3600)
    assert again.status is ClaimStatus.COMPLETED and again.record.response is not None
    await second.close()


def test_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        SQLiteStore(str(tmp_path / "nope" / "p.db"))


def test_a_file_that_is_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "p.db"
    bogus.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError, match="cannot use"):
        SQLiteStore(str(bogus))


@pytest.mark.parametrize("url", ["redis://", "sqlite://", "sqlite:///", "postgres://h/db", ""])
def test_unsupported_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="--store"):
        open_store(url)


async def test_writes_of_one_turn_share_a_transaction_and_fail_together(tmp_path: Path) -> None:
    import asyncio
    import sqlite3

    from payonce.errors import StoreTimeout

    store = SQLiteStore(str(tmp_path / "p.db"), busy_timeout=0.05)
    claims = await asyncio.gather(
        *(store.claim("t", f"k{i}", "fp", lease=30, ttl=60) for i in range(5))
    )
    assert all(c.status is ClaimStatus.ACQUIRED for c in claims)
    locker = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    results = await asyncio.gather(
        *(
            store.complete("t", f"k{i}", c.record.token, StoredResponse(200, (), b"x"))
            for i, c in enumerate(claims)
        ),
        return_exceptions=True,
    )
    assert all(isinstance(r, StoreTimeout) for r in results)
    locker.execute("ROLLBACK")
    locker.close()
    for i in range(5):
        record = await store.get("t", f"k{i}")
        assert record is not None and record.response is None, "nothing of a failed batch is kept"
    done = await asyncio.gather(
        *(
            store.complete("t", f"k{i}", c.record.token, StoredResponse(200, (), b"x"))
            for i, c in enumerate(claims)
        )
    )
    assert done == [True] * 5
    await store.close()
