"""Finding, without a write, the quiet streams a follower in another process came to read.

A stream nobody else follows is written to the store only now and then
(``recording.QUIET_SECONDS``); its writer learns from each write whether a
follower in another process (another worker, another replica) now reads it, and
from then on writes every 50 ms. Left at that, a follower who comes waits for
the next quiet write, up to the whole interval, before it sees the events
relayed here meanwhile. So every ``PROBE_SECONDS`` one task per process and
store asks the store, for all its quiet streams in one go
(:meth:`~payonce.store.Store.watched_runs`), which of them a follower marked:
one read, whatever the number of streams, instead of a write per stream.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Protocol

from payonce.errors import StorageError
from payonce.store import Store

__all__ = ["PROBE_SECONDS", "WatchProbe", "Watchable", "probe_for"]

log = logging.getLogger("payonce.gateway")

PROBE_SECONDS = 0.25


class Watchable(Protocol):
    """A stream's writer, as the probe sees it."""

    def now_watched(self) -> None:
        """A follower in another process reads this run: write often from now on."""
        ...


class WatchProbe:
    """The quiet streams of one process on one store, asked about every ``PROBE_SECONDS``."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._quiet: dict[tuple[str, str], Watchable] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, tenant: str, key: str, writer: Watchable) -> None:
        """Ask about ``(tenant, key)`` until it is watched or :meth:`discard` ed."""
        self._quiet[(tenant, key)] = writer
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def discard(self, tenant: str, key: str, writer: Watchable) -> None:
        """Stop asking about ``(tenant, key)`` for ``writer`` (a later run may hold it now)."""
        if self._quiet.get((tenant, key)) is writer:
            del self._quiet[(tenant, key)]
            if not self._quiet and self._task is not None:
                self._task.cancel()  # nothing left to ask: no task outlives the streams
                self._task = None

    def __len__(self) -> int:
        return len(self._quiet)

    async def _run(self) -> None:
        # Ends when no quiet stream is left; the next one starts it again.
        while self._quiet:
            await asyncio.sleep(PROBE_SECONDS)
            asked = dict(self._quiet)
            if not asked:
                return
            try:
                found = await self._store.watched_runs(list(asked))
            except StorageError as exc:
                # The writes say it too, later: a store that cannot answer now
                # costs a follower elsewhere at most one quiet interval.
                log.debug("could not ask which streams a follower elsewhere reads: %s", exc)
                continue
            for run in found:
                writer = asked[run]
                if self._quiet.get(run) is writer:
                    del self._quiet[run]
                    writer.now_watched()


_probes: weakref.WeakKeyDictionary[Store, WatchProbe] = weakref.WeakKeyDictionary()


def probe_for(store: Store) -> WatchProbe:
    """The probe of ``store`` in this process (made on first use)."""
    probe = _probes.get(store)
    if probe is None:
        probe = _probes[store] = WatchProbe(store)
    return probe
