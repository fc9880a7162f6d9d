"""Where a record lives in Redis: three names that share one hash tag, hence one cluster slot.

::

    payonce:{<tenant>:<key>}:r   hash     the record (fields in payonce.store.redis.scripts)
    payonce:{<tenant>:<key>}:e   list     its streamed events, event n at index n - 1
    payonce:{<tenant>:<key>}:n   channel  its notifications (complete, release, new events)

Redis Cluster hashes only the part between the first ``{`` and the first ``}``
after it (the hash tag), so the record, its events and its channel sit on one
slot: every Lua script touches keys of one slot, as a cluster requires, and
sharded Pub/Sub keeps a record's messages on the shard that stores it.

In ``<tenant>``, ``%``, ``:``, ``{`` and ``}`` are percent-escaped, so the first
``:`` after ``{`` always ends the tenant and two (tenant, key) pairs never share
a name. The key is left as it is (idempotency keys are printable ASCII): a
``}`` in it only ends the hash tag early, which moves the record's slot but
keeps its three names on the same one. The gateway's tenants are hex hashes
or ``anonymous``, so in practice the escaping never changes anything.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RecordKeys", "record_keys"]

_ESCAPES = str.maketrans({"%": "%25", ":": "%3A", "{": "%7B", "}": "%7D"})


@dataclass(frozen=True, slots=True)
class RecordKeys:
    """The Redis names of one record, as bytes ready for the wire."""

    record: bytes
    events: bytes
    channel: bytes


def record_keys(prefix: str, tenant: str, key: str) -> RecordKeys:
    """The names of the record ``(tenant, key)`` under ``prefix`` (``payonce`` by default)."""
    base = f"{prefix}:{{{tenant.translate(_ESCAPES)}:{key}}}:".encode()
    return RecordKeys(base + b"r", base + b"e", base + b"n")
