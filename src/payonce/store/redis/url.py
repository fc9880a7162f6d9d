"""``--store redis://…`` URLs: checked whole before anything connects.

::

    redis://[user:password@]host[:port][/db][?option=value&…]     one server (or a proxy)
    rediss://…                                                     the same over TLS
    redis+cluster://[user:password@]host[:port][?option=value&…]  Redis Cluster, any node
    rediss+cluster://…                                             the same over TLS

Options: ``timeout`` (seconds an operation may take before the request is
answered 503, default 5), ``prefix`` (first part of every key, default
``payonce``), and over TLS ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs`` (handed to redis-py).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from payonce.errors import ConfigError

__all__ = ["RedisURL", "parse_redis_url", "redacted"]

SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")
_TLS_OPTIONS = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"})


@dataclass(frozen=True, slots=True)
class RedisURL:
    """A checked Redis store URL: what redis-py connects to, and payonce's own options."""

    url: str  # for redis-py: redis:// or rediss://, payonce options removed
    cluster: bool
    timeout: float = 5.0
    prefix: str = "payonce"


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``: what logs and error messages show."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{host}{rest[end:]}"


def parse_redis_url(url: str) -> RedisURL:
    """Check a Redis store URL and split off payonce's options; :class:`ConfigError` if bad."""
    parts = urlsplit(url)
    url = redacted(url)  # from here on only for messages
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"--store: {url!r} is not a Redis URL ({', '.join(SCHEMES)})")
    cluster = parts.scheme.endswith("+cluster")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ConfigError(f"--store: bad port in {url!r}") from None
    if not host:
        raise ConfigError(f"--store: {url!r} has no host, e.g. redis://127.0.0.1:6379/0")
    if port == 0:
        raise ConfigError(f"--store: bad port in {url!r}")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ConfigError(f"--store: the database in {url!r} must be a number, e.g. /0")
    if cluster and path not in ("", "0"):
        raise ConfigError("--store: Redis Cluster has only database 0")
    tls = parts.scheme.startswith("rediss")
    timeout, prefix, passed = 5.0, "payonce", []
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name == "timeout":
            try:
                timeout = float(value)
            except ValueError:
                raise ConfigError(f"--store: timeout={value!r} is not a number") from None
            if not 0 < timeout <= 600:
                raise ConfigError("--store: timeout must be above 0 and at most 600 seconds")
        elif name == "prefix":
            if not value or any(c in value for c in "{}: ") or not value.isprintable():
                raise ConfigError(
                    f"--store: prefix={value!r} must be printable, without spaces, ':', '{{', '}}'"
                )
            prefix = value
        elif name in _TLS_OPTIONS and tls:
            passed.append((name, value))
        else:
            known = ", ".join(["timeout", "prefix", *(sorted(_TLS_OPTIONS) if tls else [])])
            raise ConfigError(f"--store: unknown Redis option {name!r} (known: {known})")
    scheme = "rediss" if tls else "redis"
    plain = urlunsplit((scheme, parts.netloc, parts.path, urlencode(passed), ""))
    return RedisURL(plain, cluster, timeout, prefix)
