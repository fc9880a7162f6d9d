"""The gateway's loops beside its requests: pending writes, replay counts, expired records.

Each loop sleeps between rounds and never holds the event loop for long: a purge
round is bounded (:data:`PURGE_ROUND`), store calls go through the store's own
non-blocking paths.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from payonce.errors import ProblemError
from payonce.gateway.pending import PendingWrites
from payonce.gateway.replays import ReplayCache, ReplayCounter
from payonce.observe.calllog import CallLogSink
from payonce.store import Store

__all__ = ["PURGE_ROUND", "housekeeping"]

log = logging.getLogger("payonce.gateway")

REPLAY_FLUSH_SECONDS = 1.0
# A purge round deletes at most this many expired records (on SQLite about a
# second of small chunks, the loop serving requests in between); a round that
# reached it is followed by the next a second later, not a whole interval.
PURGE_ROUND = 100_000
PURGE_AGAIN_SECONDS = 1.0


async def housekeeping(
    renewing: Coroutine[Any, Any, None],
    store: Store,
    pending: PendingWrites,
    replays: ReplayCache,
    replay_counts: ReplayCounter,
    call_log: CallLogSink | None,
    *,
    purge_every: float,
) -> None:
    """Run ``renewing`` (lease renewal) and the other loops until cancelled."""
    await asyncio.gather(
        renewing,
        _flush_replay_counts(store, replays, replay_counts, call_log),
        _purge_expired(store, purge_every),
        _retry_pending_writes(pending),
    )


async def _retry_pending_writes(pending: PendingWrites) -> None:
    # Every half second while writes wait: one failed attempt ends the round.
    while True:
        await asyncio.sleep(0.5)
        if len(pending):
            await pending.retry()


async def _flush_replay_counts(
    store: Store, replays: ReplayCache, counts: ReplayCounter, call_log: CallLogSink | None
) -> None:
    # Once a second: replay counts to the store, call log lines to their file,
    # and expired replays out of memory (no request may ever ask for them).
    while True:
        await asyncio.sleep(REPLAY_FLUSH_SECONDS)
        # Each step on its own: one that fails (a full disk under the call log)
        # must not end the others, nor this loop, for the gateway's lifetime.
        if call_log is not None:
            try:
                call_log.flush()  # keeps what it could not write (observe/calllog.py)
            except Exception:
                log.exception("call log flush failed")
        replays.evict_expired()
        try:
            await counts.flush(store)
        except Exception:
            log.exception("writing replay counts to the store failed")


async def _purge_expired(store: Store, every: float) -> None:
    pause = every
    while True:
        await asyncio.sleep(pause)
        pause = every
        try:
            purged = await store.purge_expired(PURGE_ROUND)
        except ProblemError as exc:
            log.warning("purging expired records failed: %s", exc)
            continue
        if purged:
            log.debug("purged %d expired records", purged)
        if purged >= PURGE_ROUND:  # a backlog: keep at it
            pause = min(every, PURGE_AGAIN_SECONDS)
