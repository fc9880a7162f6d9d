"""Reading an upstream stream to its end while relaying and recording it.

Events go to the :class:`LiveStream` (every client following it here) as they
arrive, and to the store in small batches (every ``FLUSH_EVENTS`` events or
``FLUSH_SECONDS``, whichever comes first), so other processes can follow and a
retry after completion replays the same events.

A stream counts as complete when the upstream ends its body cleanly. If the
upstream dies mid-way, the record is released: what was recorded is dropped
and a retry runs the request again (a provider does not bill an unfinished
generation either). If the lease is lost, the stream is still relayed to the
end but not completed. A store that cannot answer for a while (an outage, a
lock held by another process) does not stop the recording: the events wait in
memory and are written again every ``RETRY_SECONDS`` until the store takes
them, so the retry is still a replay; only past ``MAX_BACKLOG`` bytes or one
lease from the first failure is the stream relayed but not stored
(``not_stored: store_unavailable``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from payonce.errors import ProblemError, StorageError
from payonce.gateway.lease import Lease
from payonce.gateway.live import LiveStream
from payonce.gateway.observing import UpstreamFacts
from payonce.gateway.pacing import pacer_for
from payonce.gateway.sse import EventSplitter, StreamId, StreamUsage, failed_in_band
from payonce.gateway.upstream import OpenResponse
from payonce.gateway.watch_probe import probe_for
from payonce.observe.pricing import priced_call
from payonce.store import Appended, StoredResponse

__all__ = [
    "FLUSH_EVENTS",
    "FLUSH_SECONDS",
    "MAX_BACKLOG",
    "QUIET_SECONDS",
    "RETRY_SECONDS",
    "record_stream",
]

log = logging.getLogger("payonce.gateway")

FLUSH_EVENTS = 64
FLUSH_SECONDS = 0.05
# A stream no follower in another process reads (store.Appended) is written in
# larger batches: most of a keyed event's cost at token rate was its share of a
# write, which costs about as much for one event as for fifty (benchmarks/NOTEBOOK.md,
# "Streams written quietly", "Streams written every second; a probe finds
# followers", "Quiet streams every two seconds: measured, not kept"). Its events
# are in the store at most this late; a follower that comes meanwhile marks the
# record, and the process's probe (watch_probe.py) finds it within a quarter of
# a second, or the next write says so.
QUIET_SECONDS = 1.0
QUIET_EVENTS = 256
QUIET_BYTES = 256 * 1024  # watched or not: a large event (an image) is written at once
# While the store cannot take a stream's events: how often they are written again,
# and at most how many bytes of them wait in memory (docs/gateway.md, "Store outages").
RETRY_SECONDS = 0.25
MAX_BACKLOG = 4 * 1024 * 1024


class _Recorder:
    """Writes events to the store in batches, from a task of its own, in order.

    The writes run beside the relay, never in its way: :meth:`add` only queues
    events and wakes the writer (it waits only when 4 MiB are queued behind a
    write still in flight, to bound memory). A write that fails with a
    :class:`StorageError` is not the end of the record: a store that cannot
    answer for a second or two (another process holding SQLite's write lock, a
    Redis paused) would otherwise release the key at the stream's end, and the
    retry would run, and bill, the generation again. The events are kept and
    written again every ``RETRY_SECONDS``, within a bound (``MAX_BACKLOG``
    bytes, one lease from the first failure); past it recording gives up and
    the record is released, as before.
    """

    def __init__(self, lease: Lease, live: LiveStream, max_stored: int | None = None) -> None:
        self.lease = lease
        self.key = lease.key
        self.live = live
        # Events not yet recorded, numbered recorded + 1, recorded + 2, ...
        self.backlog: list[bytes] = []
        self.backlog_bytes = 0
        self.recorded = 0
        self.ok = True
        # Bytes of events left before --max-stored-body is passed (None: no bound).
        self.room = max_stored
        self.too_large = False
        self.unavailable = False  # gave up: the store was down past the bound
        self._loop = asyncio.get_running_loop()
        # A follower in another process reads this run's events from the store:
        # they are written every FLUSH_SECONDS, not every QUIET_SECONDS.
        self.watched = False
        self._probe = probe_for(lease.store)
        self._due: asyncio.TimerHandle | None = None  # the next write, when it is timed
        # The timer fired and the write waits its turn in the pacer (gateway/pacing.py):
        # streams that began together fall due together, and their writes start a
        # few a loop turn. Still "timed" meanwhile: _due stays set.
        self._queued = False
        self._pacer = pacer_for(self._loop)
        self._last_flush = self._loop.time()
        self._head: tuple[int, tuple[tuple[str, str], ...]] | None = None
        self._begun = False
        # When the first write of the current outage failed (None: no outage).
        self._failing_since: float | None = None
        # A write went through since that failure; one more, later, ends the outage.
        self._answered = False
        self._closing = False
        self._wake = asyncio.Event()
        self._written = asyncio.Event()  # after each write attempt
        self._writer: asyncio.Task[None] | None = None

    def begin(self, status: int, headers: tuple[tuple[str, str], ...]) -> None:
        """Start recording in the background: relaying the first event must not wait for it."""
        self._head = (status, headers)
        self._writer = self._loop.create_task(self._write_loop())
        # A follower elsewhere who comes is found within PROBE_SECONDS, not at
        # the next quiet write (gateway/watch_probe.py).
        self._probe.add(self.lease.tenant, self.key, self)
        self._writer.add_done_callback(self._ended)

    def _ended(self, _: object) -> None:
        self._written.set()  # however the writer ends, nobody stays waiting in add()
        self._probe.discard(self.lease.tenant, self.key, self)

    def now_watched(self) -> None:
        """A follower in another process reads this run (said by a write or the probe)."""
        if not self.watched:
            self.watched = True  # and stays so: the follower reads on
            self._probe.discard(self.lease.tenant, self.key, self)  # nothing more to ask
            if self._due is not None:
                self._flush()  # what came meanwhile goes now, not at the quiet timer

    def add(self, events: list[bytes]) -> None:
        """Queue ``events`` for the writer; then :meth:`wait_for_room` before adding more."""
        size = len(events[0]) if len(events) == 1 else sum(map(len, events))
        if self.room is not None:
            self.room -= size
            if self.room < 0:
                # Recording stops; what is recorded stays (slow followers here may
                # still read it back) until the key is released at the stream's end.
                if not self.too_large:
                    log.info(
                        "the stream of key %r passed --max-stored-body: relayed, not stored",
                        self.key,
                    )
                self.too_large = True
                self._stop()
                return
        if not self.ok:
            return
        self.backlog.extend(events)
        self.backlog_bytes += size
        if self._failing_since is not None:
            if self.backlog_bytes > MAX_BACKLOG:
                self._give_up(f"{MAX_BACKLOG >> 20} MiB of events waited for it")
            return  # the writer retries on its own schedule
        events_cap, seconds = (
            (FLUSH_EVENTS, FLUSH_SECONDS) if self.watched else (QUIET_EVENTS, QUIET_SECONDS)
        )
        if len(self.backlog) >= events_cap or self.backlog_bytes > QUIET_BYTES:
            self._flush()
        elif self._due is None:  # else a write is timed already
            wait = self._last_flush + seconds - self._loop.time()
            if wait <= 0:
                self._flush()  # sparse events go at once, as they come
            else:
                # Not yet: the write is timed, so the events before a pause (a model
                # thinking for seconds mid-answer) do not wait for the next event.
                self._due = self._loop.call_later(wait, self._came_due)

    def _came_due(self) -> None:
        self._queued = True
        self._pacer.call(self._paced_flush)

    def _paced_flush(self) -> None:
        if self._queued:  # else written meanwhile (a full batch, a follower) or stopped
            self._flush()

    def _flush(self) -> None:
        self._untime()
        self._last_flush = self._loop.time()
        self._wake.set()

    def _untime(self) -> None:
        self._queued = False
        if self._due is not None:
            self._due.cancel()
            self._due = None

    @property
    def full(self) -> bool:
        """Whether more events must wait for the write in flight (:meth:`wait_for_room`)."""
        return (
            self.backlog_bytes > MAX_BACKLOG  # first: asked of every read, and mostly false
            and self.ok
            and self._failing_since is None
            and self._writer is not None
            and not self._writer.done()
        )

    async def wait_for_room(self) -> None:
        """Memory stays bounded behind a slow (not failing) write: wait for it, as
        writing in line did. A write that fails ends the wait (the bound in :meth:`add`)."""
        while self.full:
            self._written.clear()
            await self._written.wait()

    async def finish(self) -> None:
        """Write what is left, waiting out an outage within the bound; then stop."""
        self._closing = True
        self._flush()
        if self._writer is not None:
            await asyncio.shield(self._writer)

    def cancel(self) -> None:
        """Stop writing at once (the stream broke off, or its run was cancelled)."""
        self.ok = False
        self._untime()
        if self._writer is not None:
            self._writer.cancel()

    def _stop(self) -> None:
        self.ok = False
        self._untime()
        self.backlog.clear()
        self.backlog_bytes = 0
        self._wake.set()
        self._written.set()

    def _give_up(self, why: str) -> None:
        """Past the bound: one line for the stream, and the record is released at its end."""
        log.error(
            "gave up recording the stream of key %r: the store did not answer for %.1f s"
            " and %s; relayed, not stored, its key released (a retry runs again)",
            self.key,
            self._loop.time() - (self._failing_since or self._loop.time()),
            why,
        )
        self.unavailable = True
        self._stop()

    def _done(self) -> bool:
        return self._closing and self._begun and not self.backlog and self._failing_since is None

    async def _write_loop(self) -> None:
        # The head at once: followers on other replicas see the stream begin.
        await self._write()
        self._written.set()
        while self.ok and not self._done():
            if self._failing_since is None:
                await self._wake.wait()
                self._wake.clear()
            else:
                await asyncio.sleep(RETRY_SECONDS)
                if self._loop.time() - self._failing_since >= self.lease.duration:
                    self._give_up("one --lease passed")
                    return
            if self.ok:
                await self._write()
                self._written.set()

    async def _write(self) -> None:
        """One attempt: the stream's head if not yet written, then every event queued."""
        try:
            if not self._begun:
                assert self._head is not None
                status, headers = self._head
                if not await self.lease.begin_stream(status, headers):
                    self._lost()
                    return
                self._begun = True
            batch = list(self.backlog)
            if batch:
                appended = await self.lease.append(self.recorded + 1, batch)
                if not appended:
                    self._lost()
                    return
                if appended is Appended.WATCHED:
                    self.now_watched()
            if self._failing_since is not None:
                await self._answering_again()
                if self._failing_since is not None:
                    return  # keep the events: the next attempt writes them once more
        except StorageError as exc:
            self._failed(exc)
            return
        self.recorded += len(batch)
        del self.backlog[: len(batch)]
        self.backlog_bytes -= sum(map(len, batch))
        self.live.trim(self.recorded)

    async def _answering_again(self) -> None:
        """After an outage, a write went through: renew the lease, then write once more.

        A write that timed out may still reach the store late: Redis, once it
        runs again, executes the commands that waited in its sockets, including
        an older, shorter ``append_events`` from the same first event, which would
        cut the events written after it. So the events stay queued until a
        second write, a retry interval later, rewrites them from the same first
        event: by then the store has long run what waited for it.
        """
        if not self._answered:
            if not await self.lease.renew():
                self._lost()
                return
            self._answered = True
            return
        log.warning(
            "the store answers again: recorded the events of key %r that waited for it",
            self.key,
        )
        self._failing_since, self._answered = None, False

    def _failed(self, exc: StorageError) -> None:
        if self._failing_since is None:
            log.error(
                "cannot record the stream of key %r for now (retried every %g s): %s",
                self.key,
                RETRY_SECONDS,
                exc,
            )
            self._failing_since = self._loop.time()
        self._answered = False

    def _lost(self) -> None:
        # The lease passed to another holder (or the record is gone): fencing
        # refuses this run's writes, and nothing it holds should be recorded.
        log.warning("stopped recording the stream of key %r: its lease was lost", self.key)
        self._stop()


async def record_stream(
    lease: Lease,
    response: OpenResponse,
    live: LiveStream,
    *,
    strip_usage: bool,
    on_last_event: Callable[[], object],
    joined: Callable[[], int],
    facts: UpstreamFacts,
    max_stored: int | None = None,
) -> StoredResponse | None:
    """Relay ``response`` into ``live``, record it under ``lease``, then complete or release.

    Events past ``max_stored`` bytes are relayed and not recorded; the record is
    then released (``facts.not_stored``), so a retry runs again. So is a stream
    whose events the store could not take within the bound (4 MiB, one
    ``--lease`` from the first failure): ``facts.not_stored`` is then
    ``store_unavailable``. Within it, the stream's end waits for them to be
    written. A completed stream is replayed for ``--ttl`` (:meth:`Lease.complete`).
    """
    recorder = _Recorder(lease, live, max_stored)
    recorder.begin(response.status, response.headers)
    try:
        return await _relay_and_settle(
            lease,
            response,
            live,
            recorder,
            strip_usage=strip_usage,
            on_last_event=on_last_event,
            joined=joined,
            facts=facts,
        )
    finally:
        # Cancelled (shutdown, every client left with --on-stream-disconnect cancel)
        # or failed: no write of this run may go on after it.
        recorder.cancel()


async def _relay_and_settle(
    lease: Lease,
    response: OpenResponse,
    live: LiveStream,
    recorder: _Recorder,
    *,
    strip_usage: bool,
    on_last_event: Callable[[], object],
    joined: Callable[[], int],
    facts: UpstreamFacts,
) -> StoredResponse | None:
    splitter = EventSplitter()
    usage = StreamUsage()
    # Without a request-id header, the stream's own id is the join key with the bill.
    stream_id = None if facts.request_id is not None else StreamId()

    def take(events: list[bytes]) -> None:
        if stream_id is not None and not stream_id.done:
            for event in events:
                if stream_id.feed(event):
                    facts.request_id = stream_id.value
                    break
        # The usage chunk the gateway asked for on the client's behalf is not relayed.
        kept = [event for event in events if not (usage.inspect(event) and strip_usage)]
        if facts.not_stored is None:
            for event in kept:
                if failed_in_band(event):
                    facts.not_stored = "upstream_error"  # relayed, never replayed: see below
                    break
        if kept:
            live.append(kept)
            recorder.add(kept)
            if recorder.too_large:
                facts.not_stored = "too_large"

    def take_now(chunk: bytes) -> bool:
        # As the bytes arrive, in the upstream connection's callback: the events
        # go to the followers that keep up and to the recorder without this task
        # waking, unless the recorder is full (then the loop below waits for room).
        if recorder.backlog_bytes > MAX_BACKLOG and recorder.full:  # mostly false at once
            return False
        events = splitter.feed(chunk)
        if len(events) != 1 or (stream_id is not None and not stream_id.done):
            take(events)
            return True
        # At token rate a read is one event: take's work spelled out for it, no
        # list built and three calls fewer per event (benchmarks/NOTEBOOK.md,
        # "An event's calls counted"). The cheap test first: most events hold no
        # "error" at all.
        event = events[0]
        if usage.inspect(event) and strip_usage:
            return True
        if facts.not_stored is None and event.find(b"error") >= 0 and failed_in_band(event):
            facts.not_stored = "upstream_error"
        live.append(events)
        recorder.add(events)
        if recorder.too_large:
            facts.not_stored = "too_large"
        return True

    try:
        async for chunk in response.chunks(take_now):
            await recorder.wait_for_room()
            take_now(chunk)  # not full now: it takes the chunk
        take(splitter.close())
    except ProblemError as exc:
        log.warning("the upstream stream of key %r broke off: %s", lease.key, exc.detail)
        recorder.cancel()
        facts.usage_missing = "no_response"
        on_last_event()
        live.finish(failed=True)
        await lease.release_or_retry()
        return None
    # Still a run of this process meanwhile: its lease is renewed (renew_leases).
    await recorder.finish()
    if recorder.unavailable and facts.not_stored is None:
        facts.not_stored = "store_unavailable"
    on_last_event()
    facts.model, facts.usage = usage.model, usage.usage
    facts.cost_usd, facts.price_source, facts.list_cost_usd = priced_call(usage.model, usage.usage)
    try:
        if not recorder.ok or facts.not_stored == "upstream_error":
            # An error event on a 200 (Anthropic's overloaded_error, OpenRouter's
            # error chunk): no whole answer, none billed, so a retry runs again.
            await lease.release_or_retry()
            return None
        stored = StoredResponse(response.status, response.headers, b"", stream=True)
        completed = await lease.complete_or_retry(
            stored, usage=facts.usage, cost_usd=facts.cost_usd, replays=joined()
        )
    finally:
        live.finish()
    return stored if completed else None
