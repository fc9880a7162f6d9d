"""Stores: where idempotency records live (``memory://``, ``sqlite:///path.db``)."""

from __future__ import annotations

from payonce.clock import Clock
from payonce.errors import ConfigError
from payonce.store.base import Claim, ClaimStatus, Record, RecordState, Store, StoredResponse
from payonce.store.memory import MemoryStore
from payonce.store.sqlite import SQLiteStore

__all__ = [
    "Claim",
    "ClaimStatus",
    "MemoryStore",
    "Record",
    "RecordState",
    "SQLiteStore",
    "Store",
    "StoredResponse",
    "open_store",
    "validate_store_url",
]


def validate_store_url(url: str) -> str:
    """Check a ``--store`` URL's form without opening it; return it unchanged."""
    if url == "memory://" or url.startswith("sqlite:///"):
        if url.startswith("sqlite:///") and len(url) == len("sqlite:///"):
            raise ConfigError("--store: sqlite:/// needs a file path, e.g. sqlite:///./payonce.db")
        return url
    raise ConfigError(
        f"--store: unsupported store URL {url!r}; use memory:// or sqlite:///path.db"
    )


def open_store(url: str, clock: Clock | None = None) -> Store:
    """Open the store a ``--store`` URL names."""
    validate_store_url(url)
    if url == "memory://":
        return MemoryStore(clock)
    # sqlite:///relative.db and sqlite:////absolute.db, as in SQLAlchemy.
    return SQLiteStore(url[len("sqlite:///") :], clock)
