"""``redis://``, ``rediss://`` and ``redis+cluster://`` stores: one record store for many replicas.

::

    store.py    RedisStore: the Store protocol, errors translated at this boundary
    scripts.py  the Lua scripts, one per state change, KEYS[]/ARGV[] documented
    keys.py     the key layout: payonce:{<tenant>:<key>}:r|e|n on one cluster slot
    notify.py   wait() without polling: per-record Pub/Sub
    batch.py    auto-pipelining: one event-loop turn's commands in one pipeline
    url.py      the --store URL and its options

redis-py takes a tenth of a second to import, so :class:`RedisStore` is
imported on first use: checking a URL (``payonce serve --help``, config
errors) does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from payonce.store.redis.url import SCHEMES, RedisURL, parse_redis_url, redacted

if TYPE_CHECKING:
    from payonce.store.redis.store import RedisStore

__all__ = ["SCHEMES", "RedisStore", "RedisURL", "parse_redis_url", "redacted"]


def __getattr__(name: str) -> Any:
    if name == "RedisStore":
        from payonce.store.redis.store import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
