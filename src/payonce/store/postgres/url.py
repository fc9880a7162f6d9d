"""``--store postgresql://…`` URLs: checked whole before anything connects.

::

    postgresql://user@host[:port]/database[?option=value&…]
    postgres://…                                            the same

The password is never part of the URL (a flag's value is in every process
listing): it comes from ``PAYONCE_STORE_PASSWORD``, else from ``PGPASSWORD`` or
``~/.pgpass`` (``PGPASSFILE``), which the driver reads itself. A URL with a
password is refused.

Options: ``sslmode`` (``disable``, ``prefer``, ``require``, ``verify-ca``,
``verify-full``: libpq's meanings), ``timeout`` (seconds a statement, a lock
wait or a wait for a pooled connection may take before the request is
answered 503, default 5), ``pool`` (connections per gateway process, default
10), ``prepared`` (``on``, the default, or ``off``: no named prepared
statements and no session settings, for PgBouncer in transaction mode before
1.21 or without ``max_prepared_statements``; the client still cancels a
statement that outlives ``timeout``), ``listen`` (``on``, the default, or ``off``:
followers in other processes poll instead of waiting for ``NOTIFY``, for a
pooler in transaction mode, where ``LISTEN`` does not work).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from payonce.errors import ConfigError

__all__ = ["PASSWORD_ENV", "SCHEMES", "PostgresURL", "parse_postgres_url"]

SCHEMES = ("postgresql", "postgres")
PASSWORD_ENV = "PAYONCE_STORE_PASSWORD"  # noqa: S105 - a variable's name
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_SWITCH = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}


@dataclass(frozen=True, slots=True)
class PostgresURL:
    """A checked PostgreSQL store URL: the driver's DSN, and payonce's own options."""

    dsn: str  # postgresql://user@host:port/db[?sslmode=…]
    timeout: float = 5.0
    pool: int = 10
    prepared: bool = True
    listen: bool = True

    @property
    def where(self) -> str:
        """Host, port and database, for messages (never a password: the URL has none)."""
        parts = urlsplit(self.dsn)
        return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


def _number(name: str, value: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--store: {name}={value!r} is not a number") from None
    if not low < number <= high:
        raise ConfigError(f"--store: {name} must be above {low:g} and at most {high:g}")
    return number


def parse_postgres_url(url: str) -> PostgresURL:
    """Check a PostgreSQL store URL; :class:`ConfigError` (one line) if it is bad."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"--store: {url!r} is not a PostgreSQL URL (postgresql://)")
    if parts.password is not None:
        raise ConfigError(
            f"--store: a password in the URL would show in the process list; put it in"
            f" {PASSWORD_ENV} or ~/.pgpass"
        )
    try:
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError(f"--store: bad port in {url!r}") from None
    if not host:
        raise ConfigError(
            f"--store: {url!r} has no host, e.g. postgresql://payonce@db:5432/payonce"
        )
    database = parts.path.strip("/")
    if not database or "/" in database:
        raise ConfigError(
            f"--store: {url!r} names no database, e.g. postgresql://user@host/payonce"
        )
    timeout, pool, prepared, listen = 5.0, 10, True, True
    passed: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "sslmode":
            if value not in _SSLMODES:
                raise ConfigError(f"--store: sslmode={value!r} (known: {', '.join(_SSLMODES)})")
            passed.append((name, value))
        elif name == "timeout":
            timeout = _number(name, value, 0, 600)
        elif name == "pool":
            pool = int(_number(name, value, 0, 1000))
            if pool < 2:
                # One connection serves requests, and a claim must never wait behind a
                # long purge or a stream's append in the only one there is.
                raise ConfigError("--store: pool must be at least 2")
        elif name in ("prepared", "listen"):
            if value.lower() not in _SWITCH:
                raise ConfigError(f"--store: {name}={value!r} must be on or off")
            if name == "prepared":
                prepared = _SWITCH[value.lower()]
            else:
                listen = _SWITCH[value.lower()]
        else:
            raise ConfigError(
                f"--store: unknown PostgreSQL option {name!r}"
                " (known: sslmode, timeout, pool, prepared, listen)"
            )
    query = "&".join(f"{name}={value}" for name, value in passed)
    dsn = urlunsplit(("postgresql", parts.netloc, "/" + database, query, ""))
    return PostgresURL(dsn, timeout, pool, prepared, listen)
