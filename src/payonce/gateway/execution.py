"""One keyed upstream run, owned by this process, and the duplicates that join it.

The run is a task of its own, detached from the client's request: when the
client disconnects or times out, the upstream call goes on and its result is
stored for the retry (docs/gateway.md, "The contract"). Duplicates arriving at this
process await its ``head``: the whole response, or, for a stream, the
:class:`LiveStream` they all follow. One loop renews the leases of every run in
progress (:func:`renew_leases`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from payonce.errors import ProblemError, StorageError
from payonce.gateway.lease import Lease
from payonce.gateway.live import LiveStream
from payonce.gateway.observing import UpstreamFacts, provider_request_id
from payonce.gateway.recording import record_stream
from payonce.gateway.request import ProxiedRequest
from payonce.gateway.runs import RunTable
from payonce.gateway.sse import ask_for_usage, is_event_stream, not_asked_for_usage
from payonce.gateway.upstream import Upstream, UpstreamResponse
from payonce.observe.pricing import priced_call
from payonce.observe.usage import model_usage_and_id
from payonce.store import StoredResponse

# Lease renewals in flight at once.
RENEW_CHUNK = 128
# How often per lease the renewal loop looks for runs due (each is due a third of a
# lease after its last renewal, so at most a tenth of that late).
RENEW_TICKS = 30

__all__ = [
    "Execution",
    "Head",
    "Outcome",
    "is_stored_status",
    "renew_leases",
    "run_execution",
]

log = logging.getLogger("payonce.gateway")

Outcome = UpstreamResponse | ProblemError
Head = Outcome | LiveStream  # what a client of the key is answered with


def is_stored_status(status: int) -> bool:
    """2xx and most 4xx are the request's answer and are replayed; these are not.

    408, 409, 429 and 5xx say the upstream did not do the work (or may not
    have), so the record is released and the next retry runs again, as Azure's
    Repeatability and Stripe do.
    """
    return status < 500 and status not in (408, 409, 429)


@dataclass(slots=True, eq=False)
class Execution:
    """One keyed run of this process: its lease, its answer's head, its joiners."""

    lease: Lease
    fingerprint: str
    head: asyncio.Future[Head] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    task: asyncio.Task[StoredResponse | None] | None = None
    facts: UpstreamFacts = field(default_factory=UpstreamFacts)
    joined: int = 0  # duplicates that awaited this run: counted as replays when it completes
    # When the lease was last taken or renewed (the event loop's clock): each run is
    # renewed a third of a lease after that, not all runs at once (renew_leases).
    renewed: float = field(default_factory=lambda: asyncio.get_running_loop().time())

    @property
    def tenant(self) -> str:
        return self.lease.tenant

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def head_value(self) -> Head | None:
        """The head once known (a whole response, a problem, or the live stream)."""
        if self.head.done() and not self.head.cancelled():
            return self.head.result()
        return None


async def renew_leases(running: RunTable[Execution], lease: float) -> None:
    """Renew each run's lease a third of a lease after it was taken or renewed, forever.

    Each renewal also moves the run's expiry on as the store moves the record's
    (:meth:`Lease.renew`): a run longer than ``--ttl`` keeps its key.

    The loop looks every ``lease / RENEW_TICKS`` seconds and renews the runs that are
    due, so renewals are spread as the runs started. Renewing every run at once, every
    third of a lease, was a burst of 5,000 renewals every 10 s with 5,000 calls in
    flight, 40 pipelines of 128 in a row on the gateway's core, and the calls that
    arrived meanwhile waited for them (benchmarks/NOTEBOOK.md, "Lease renewals spread").
    """
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(lease / RENEW_TICKS)
        now = loop.time()
        runs = [run for run in running if now - run.renewed >= lease / 3]
        for run in runs:
            run.renewed = now
        # Concurrently, a chunk at a time: the store can then put many renewals
        # in one transaction (SQLite) or round trip, instead of one per loop
        # turn for each of thousands of runs in flight.
        for start in range(0, len(runs), RENEW_CHUNK):
            chunk = runs[start : start + RENEW_CHUNK]
            await asyncio.gather(*(_renew(running, run) for run in chunk))


async def _renew(running: RunTable[Execution], execution: Execution) -> None:
    try:
        held = await execution.lease.renew()
    except StorageError as exc:
        log.warning("cannot renew the lease of key %r: %s", execution.key, exc)
        return
    if not held and running.holds(execution):
        log.warning("lost the lease of key %r; its result will not be stored", execution.key)


async def run_execution(
    upstream: Upstream,
    execution: Execution,
    request: ProxiedRequest,
    *,
    running: RunTable[Execution],
    inject_stream_usage: bool = True,
    max_stored_body: int | None = None,
) -> StoredResponse | None:
    """Call the upstream, resolve ``execution.head``, then store or release the record.

    Returns the stored response, or ``None`` when nothing was stored; a stored
    answer is replayed for ``--ttl`` from its completion. A store write that
    fails is retried once the store is back (:meth:`Lease.complete_or_retry`).
    An answer over ``max_stored_body`` bytes (a stream: its events) is relayed
    whole but not stored, and the key released (``facts.not_stored``).
    """
    lease = execution.lease
    facts = execution.facts
    body = request.body
    started = facts.started = time.perf_counter()
    added_usage = ask_for_usage(request.raw_path, body) if inject_stream_usage else None
    try:
        outcome: Outcome
        try:
            async with upstream.open(
                request.method,
                request.raw_path,
                request.query,
                request.upstream_headers(),
                added_usage or body,
                on_attempt=facts.sent,
            ) as response:
                facts.status, facts.attempts = response.status, response.attempts
                facts.request_id = provider_request_id(response.headers)
                if is_event_stream(response.content_type) and is_stored_status(response.status):
                    facts.stream = True

                    async def backlog(after: int, upto: int) -> list[bytes]:
                        events = await lease.store.read_events(lease.tenant, lease.key, after)
                        return events[: upto - after]

                    live = LiveStream(response.status, response.headers, backlog)
                    execution.head.set_result(live)
                    stored = await record_stream(
                        lease,
                        response,
                        live,
                        strip_usage=added_usage is not None,
                        on_last_event=lambda: running.finish(execution),
                        joined=lambda: execution.joined,
                        facts=facts,
                        max_stored=max_stored_body,
                    )
                    facts.latency = time.perf_counter() - started
                    if facts.usage is None and not_asked_for_usage(
                        request.raw_path, body, inject_stream_usage
                    ):
                        facts.usage_missing = "not_requested"
                    return stored
                outcome = UpstreamResponse(
                    response.status, response.headers, await response.read(), response.raw_headers
                )
        except ProblemError as exc:
            outcome = exc
        facts.latency = time.perf_counter() - started
        # No new joiners past this point: later duplicates go through the store.
        running.finish(execution)
        stored = await _settle(execution, outcome, max_stored_body)
        execution.head.set_result(outcome)
        return stored
    except asyncio.CancelledError:
        # Cancelled at shutdown: give the key up so a retry can run.
        _abandon(execution, running)
        await lease.release_or_retry()
        raise
    except Exception:
        log.exception("the run of key %r failed", execution.key)
        _abandon(execution, running)
        await lease.release_or_retry()
        return None


def _abandon(execution: Execution, running: RunTable[Execution]) -> None:
    """Let everyone waiting on a run that will not finish know it, at once."""
    running.finish(execution)
    head = execution.head_value
    if isinstance(head, LiveStream):
        if not head.finished:
            head.finish(failed=True)
    elif not execution.head.done():
        execution.head.set_result(ProblemError("the gateway failed unexpectedly; see its log"))


async def _settle(
    execution: Execution, outcome: Outcome, max_stored_body: int | None
) -> StoredResponse | None:
    lease = execution.lease
    if isinstance(outcome, ProblemError) or not is_stored_status(outcome.status):
        await lease.release_or_retry()
        return None
    response = StoredResponse(outcome.status, outcome.headers, outcome.body)
    facts = execution.facts
    facts.model, facts.usage, body_id = model_usage_and_id(outcome.body, outcome.headers)
    facts.request_id = facts.request_id or body_id
    facts.cost_usd, facts.price_source, facts.list_cost_usd = priced_call(facts.model, facts.usage)
    if max_stored_body is not None and len(outcome.body) > max_stored_body:
        # Relayed to its clients, but the key is given up: a retry runs again.
        facts.not_stored = "too_large"
        log.info(
            "the answer of key %r is %d bytes, over --max-stored-body: relayed, not stored",
            lease.key,
            len(outcome.body),
        )
        await lease.release_or_retry()
        return None
    stored = await lease.complete_or_retry(
        response, usage=facts.usage, cost_usd=facts.cost_usd, replays=execution.joined
    )
    if stored is None:
        return None  # the store is down: the client has its answer, the write waits
    if not stored:
        log.warning(
            "the result of key %r was not stored: its lease passed to another holder", lease.key
        )
        return None
    return response
