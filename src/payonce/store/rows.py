"""A record read back from a SQL store's row, in the column order both SQL stores select.

Columns: tenant, key, fingerprint, state, token, created_at, lease_expires_at,
expires_at, completed_at, status, headers, body, replays, usage, cost_usd,
stream, and the number of recorded events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from payonce.store.base import Record, RecordState
from payonce.store.sealing import Codec

__all__ = ["record_from_row"]


def record_from_row(row: Sequence[Any], codec: Codec) -> Record:
    """The :class:`Record` a SQL row holds; its response opened with ``codec``."""
    (tenant, key, fingerprint, state, token, created_at, lease_end, expires_at, completed_at,
     status, headers, body, replays, usage, cost_usd, stream, events) = tuple(row)  # fmt: skip
    response = None
    if status is not None:
        response = codec.response_in(tenant, key, status, headers, bytes(body or b""), bool(stream))
    return Record(
        tenant=tenant,
        key=key,
        fingerprint=fingerprint,
        state=RecordState(state),
        token=token,
        created_at=created_at,
        lease_expires_at=lease_end,
        expires_at=expires_at,
        completed_at=completed_at,
        response=response,
        replays=replays,
        usage=orjson.loads(usage) if usage else None,
        cost_usd=cost_usd,
        events=events,
    )
