"""``postgresql://`` stores: records in the database most platform teams already run.

::

    store.py    PostgresStore: the Store protocol on asyncpg, errors translated here
    schema.py   the versioned schema, migrated under an advisory lock
    notify.py   waking followers in other processes: NOTIFY, coalesced, and LISTEN
    url.py      the --store URL, its options, and where the password comes from

asyncpg is imported on first use (:class:`PostgresStore`): checking a URL
(``payonce serve --help``, config errors) does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from payonce.store.postgres.url import PASSWORD_ENV, SCHEMES, PostgresURL, parse_postgres_url

if TYPE_CHECKING:
    from payonce.store.postgres.store import PostgresStore

__all__ = ["PASSWORD_ENV", "SCHEMES", "PostgresStore", "PostgresURL", "parse_postgres_url"]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from payonce.store.postgres.store import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
