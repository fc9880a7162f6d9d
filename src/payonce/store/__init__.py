"""Stores: where idempotency records live (``memory://``, ``sqlite:///path.db``, ``redis://``,
``postgresql://``)."""

from __future__ import annotations

from urllib.parse import parse_qs

from payonce.clock import Clock
from payonce.errors import ConfigError
from payonce.store.base import (
    Appended,
    Claim,
    ClaimStatus,
    Record,
    RecordState,
    Store,
    StoredResponse,
    held_expiry,
)
from payonce.store.memory import MemoryStore
from payonce.store.postgres import SCHEMES as POSTGRES_SCHEMES
from payonce.store.postgres import parse_postgres_url
from payonce.store.redis import SCHEMES as REDIS_SCHEMES
from payonce.store.redis import parse_redis_url, redacted
from payonce.store.sealing import PLAIN, Codec, Sealing
from payonce.store.sqlite import SQLiteStore

__all__ = [
    "Appended",
    "Claim",
    "ClaimStatus",
    "Codec",
    "MemoryStore",
    "Record",
    "RecordState",
    "SQLiteStore",
    "Sealing",
    "Store",
    "StoredResponse",
    "held_expiry",
    "open_store",
    "validate_store_url",
]


def validate_store_url(url: str) -> str:
    """Check a ``--store`` URL's form without opening it; return it unchanged."""
    if url == "memory://" or url.startswith("sqlite:///"):
        if url.startswith("sqlite:///") and len(url) == len("sqlite:///"):
            raise ConfigError("--store: sqlite:/// needs a file path, e.g. sqlite:///./payonce.db")
        return url
    if url.partition("://")[0] in REDIS_SCHEMES:
        parse_redis_url(url)
        return url
    if url.partition("://")[0] in POSTGRES_SCHEMES:
        parse_postgres_url(url)
        return url
    raise ConfigError(
        f"--store: unsupported store URL {redacted(url)!r}; use memory://, sqlite:///path.db,"
        " redis://host:port/db, redis+cluster://host:port or postgresql://user@host:port/db"
    )


def open_store(
    url: str, clock: Clock | None = None, codec: Codec = PLAIN, *, migrate: bool = True
) -> Store:
    """Open the store a ``--store`` URL names.

    ``codec``: the stored form of response bodies, headers and events
    (:mod:`payonce.store.sealing`); ``memory://`` ignores it, since it keeps
    records only in the process's memory, as the key is.

    ``sqlite:///relative.db`` and ``sqlite:////absolute.db`` as in SQLAlchemy;
    ``?timeout=SECONDS`` sets how long a read or write waits for another
    process's lock before the request is answered 503 (default 5); the wait
    is retries from a timer, never a block of the event loop.

    ``redis://host:port/db``, ``rediss://…`` (TLS), ``redis+cluster://host:port``:
    see :mod:`payonce.store.redis.url` for the options.

    ``postgresql://user@host:port/db``: see :mod:`payonce.store.postgres.url`;
    ``migrate``: apply the schema at first use (else only check its version).
    """
    validate_store_url(url)
    if url == "memory://":
        return MemoryStore(clock)
    if url.partition("://")[0] in REDIS_SCHEMES:
        from payonce.store.redis import RedisStore  # imports redis-py: only when used

        return RedisStore(url, clock, codec=codec)
    if url.partition("://")[0] in POSTGRES_SCHEMES:
        from payonce.store.postgres import PostgresStore  # imports asyncpg: only when used

        return PostgresStore(url, clock, codec=codec, migrate=migrate)
    path, _, query = url[len("sqlite:///") :].partition("?")
    busy_timeout = 5.0
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if name != "timeout":
            raise ConfigError(f"--store: unknown SQLite option {name!r} (known: timeout)")
        try:
            busy_timeout = float(values[-1])
        except ValueError:
            raise ConfigError(f"--store: timeout={values[-1]!r} is not a number") from None
        if not 0 <= busy_timeout <= 600:
            raise ConfigError("--store: timeout must be between 0 and 600 seconds")
    return SQLiteStore(path, clock, busy_timeout=busy_timeout, codec=codec)
