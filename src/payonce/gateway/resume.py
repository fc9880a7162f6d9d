"""Resuming a keyed stream with ``Last-Event-ID``: from the run its events came from, or not.

Every relayed event's id names its run (``id: 20-3fa94c1e``: event 20 of the run
whose :func:`~payonce.gateway.sse.run_tag` is ``3fa94c1e``). A resume is answered
only from that run: live in this process, or recorded in the store (still
running on another replica, or completed). When that run is gone (its upstream
died and the key was released, its gateway stopped and its lease lapsed, or
another run holds or completed the key since) the answer is 412
``stream-not-resumable``: the events after 20 of another run would splice two
answers (issue 29). A resume never claims the key, so it never starts a run;
sending the request again without ``Last-Event-ID`` starts over, which is the
client's decision since it may bill again.

A plain number (``Last-Event-ID: 20``, the ids gateways sent before runs were
named) is refused the same way: nothing in it tells which run counted those 20
events, so it can never be proved to belong to the current one. ``0`` (no event
received) is no resume at all: the caller serves the request as without it.
"""

from __future__ import annotations

import asyncio

from payonce.clock import Clock
from payonce.errors import RequestInProgress, StreamNotResumable
from payonce.gateway.execution import Execution
from payonce.gateway.runs import RunTable
from payonce.gateway.sse import LastEventId, run_tag
from payonce.store import Record, RecordState, Store

__all__ = ["find_run"]


async def find_run(
    running: RunTable[Execution],
    store: Store,
    clock: Clock,
    tenant: str,
    key: str,
    resume: LastEventId,
    deadline: float,
) -> Execution | Record:
    """The run ``resume`` continues: this process's, or its record to relay events from.

    Raises :class:`StreamNotResumable` when that run is gone or unnamed, and
    :class:`RequestInProgress` when its record has no stream yet at ``deadline``
    (the event loop's clock; the holder has relayed events it has not yet recorded
    the start of, which takes milliseconds unless the store is failing).
    """
    if resume.run is None:
        raise StreamNotResumable(
            f"Last-Event-ID {resume.after} does not say which run of Idempotency-Key {key!r}"
            " sent those events (an id from an older gateway), so their continuation cannot"
            " be told from another run's; send the request without Last-Event-ID to start over"
        )
    local = running.get(tenant, key)
    if local is not None and run_tag(local.lease.token) == resume.run:
        return local
    loop = asyncio.get_running_loop()
    record = await store.get(tenant, key)
    while True:
        if record is None or run_tag(record.token) != resume.run:
            raise _gone(key, resume, "its upstream failed or another run replaced it")
        if record.lease_lapsed(clock.now()):
            raise _gone(key, resume, "the gateway running it stopped")
        if record.streaming:
            return record
        if record.state is RecordState.COMPLETED:
            raise _gone(key, resume, "it stored a whole answer, not a stream")
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise RequestInProgress(
                f"the stream of Idempotency-Key {key!r} has not been recorded yet; retry later",
                retry_after=1,
            )
        record = await store.wait(tenant, key, remaining)


def _gone(key: str, resume: LastEventId, why: str) -> StreamNotResumable:
    assert resume.run is not None
    return StreamNotResumable(
        f"the run of Idempotency-Key {key!r} that sent event"
        f" {resume.after}-{resume.run.decode()} is gone ({why}): the rest of its stream"
        " cannot be sent; send the request without Last-Event-ID to start over"
    )
