"""The gateway as a pure ASGI application: routing, pass-through and the keyed state machine.

Keyed request, in order (docs/gateway.md, "The contract"; docs/design.md, "The states
of a keyed request")::

    parse key ─ bad ──────────────────────────────────────────► 400
    no credential and --require-credential ───────────────────► 401
    tenant past --max-inflight-per-tenant ────────────────────► 429
    read body ─ too big ──────────────────────────────────────► 413
    replay cache hit ─ same fingerprint ──────────────────────► replay (no store call)
                     ─ other fingerprint ─────────────────────► 422
    Last-Event-ID ─ its run, live here or recorded ───────────► its events after that one
                  ─ its run gone, or a plain number ──────────► 412 (never claims: resume.py)
    same key running here? ─ same fingerprint ─► join ────────► its result, or follow its stream
    store.claim ─ MISMATCH ───────────────────────────────────► 422
                ─ COMPLETED ──────────────────────────────────► replay (a stream: its events)
                ─ (before it: a new key past --max-new-keys-per-tenant ► 429)
                ─ IN_PROGRESS in another process ─ a stream ─► follow its recorded events
                                                 ─ otherwise ► store.wait, claim again; past
                                                   --wait-timeout ──► 409 + Retry-After
                ─ ACQUIRED ─► run_execution (detached task) ──► upstream result or live stream
                ─ store down ─────────────────────────────────► 503

Each outcome has one handler (``_join_here``, ``_acquired``, ``_completed``,
``_follow_recorded``, ``_wait_elsewhere``), and a keyed answer is observed once,
in ``_keyed``. The runs in progress here live in one
:class:`~payonce.gateway.runs.RunTable`: a run enters it when its claim is won
and leaves it once, however it ends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, cast

from payonce.clock import Clock, SystemClock
from payonce.config import GatewaySettings
from payonce.errors import (
    BadRequestTarget,
    CredentialRequired,
    FingerprintMismatch,
    IdempotencyKeyRequired,
    InvalidIdempotencyKey,
    ProblemError,
    RequestInProgress,
    ShuttingDown,
    StorageError,
    TenantLimited,
)
from payonce.gateway import admin
from payonce.gateway.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    body_writer,
    break_response,
    broken_reason,
    client_left,
    problem_response,
    read_body,
    send_response,
)
from payonce.gateway.execution import Execution, Head, renew_leases, run_execution
from payonce.gateway.housekeeping import housekeeping
from payonce.gateway.keys import (
    ANONYMOUS,
    DEFAULT_CREDENTIAL_HEADERS,
    Tenants,
    fingerprint,
    read_key,
)
from payonce.gateway.lease import Lease
from payonce.gateway.limits import in_a_slot, limits_of, refuse_new_key
from payonce.gateway.live import LiveStream
from payonce.gateway.observing import (
    Observer,
    UpstreamFacts,
    model_of,
    outcome_of,
    stored_facts,
    stored_request_id,
)
from payonce.gateway.passthrough import PassThrough
from payonce.gateway.pending import PendingWrites
from payonce.gateway.relay import relay_live, relay_stored, send_whole
from payonce.gateway.replays import CachedReplay, ReplayCache, ReplayCounter
from payonce.gateway.request import ProxiedRequest, header
from payonce.gateway.resume import find_run
from payonce.gateway.runs import RunTable
from payonce.gateway.sdk_retries import (
    STREAM_GRACE,
    SdkAttempt,
    implicit_key,
    is_implicit,
    sdk_attempt,
)
from payonce.gateway.sse import LastEventId, StreamId, not_asked_for_usage, read_last_event_id
from payonce.gateway.store_failures import StoreFailures
from payonce.gateway.upstream import Upstream
from payonce.observe.calllog import CallLogSink, CallRecord
from payonce.observe.metrics import Metrics
from payonce.observe.scenarios import Scenarios
from payonce.observe.tracing import open_tracing
from payonce.store import ClaimStatus, Record, RecordState, Store, StoredResponse

__all__ = ["Gateway"]

log = logging.getLogger("payonce.gateway")

_JOINED = (b"idempotent-replayed", b"true")
_NOT_REPLAYED = (b"idempotent-replayed", b"false")
# What OPTIONS * (a question about the server itself, RFC 9110 section 9.3.7) is told.
_ALLOW = (b"allow", b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")


async def _send_replay(send: Send, replay: CachedReplay) -> None:
    start, body = replay.messages
    await send(start)
    await send(body)


@dataclass(slots=True)
class _Seen:
    """What a keyed request was answered with, for its one observation."""

    facts: UpstreamFacts | None = None
    saved: bool = False  # answered without an upstream call of its own


def _mismatch(key: str) -> FingerprintMismatch:
    return FingerprintMismatch(f"Idempotency-Key {key!r} was first used with a different request")


def _cancel_unread(stream: LiveStream, execution: Execution) -> None:
    """Cancel an SDK call's stream that nobody has read since its grace began."""
    task = execution.task
    if stream.followers == 0 and not stream.finished and task is not None and not task.done():
        log.info("no retry came for the SDK stream %r: cancelling it", execution.key)
        task.cancel()


def _last_event_id(headers: list[tuple[bytes, bytes]]) -> LastEventId | None:
    """What a resuming client has received (``Last-Event-ID``); ``None``: not a resume.

    ``0`` is no resume either: with nothing received there is nothing to splice.
    """
    raw = header(headers, b"last-event-id")
    if raw is None or not raw.strip():
        return None
    value = read_last_event_id(raw)
    if value is None:
        raise InvalidIdempotencyKey(
            "Last-Event-ID must be the id of an event this gateway sent (its id: field,"
            " such as 12-3fa94c1e)"
        )
    if value.after == 0 and value.run is None:
        return None
    return value


class Gateway:
    """The ASGI app. Holds no per-request state beyond the executions it runs."""

    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        upstream: Upstream,
        clock: Clock | None = None,
        call_log: CallLogSink | None = None,
        metrics_dir: str | None = None,
    ) -> None:
        """``metrics_dir``: a ``--workers`` worker's shared metrics (:class:`Metrics`)."""
        self.settings = settings
        self.store = store
        self.upstream = upstream
        self.clock = clock or SystemClock()
        scenarios = Scenarios(
            settings.scenario_header,
            settings.scenarios,
            cast("dict[str, str]", settings.credential_scenario),
        )
        self.metrics = Metrics(metrics_dir, scenarios) if settings.metrics else None
        tracing = open_tracing() if settings.otel else None
        self.observer = Observer(self.metrics, call_log, self.clock, tracing, scenarios)
        # The tenant is needed for a scenario set per credential (--credential-scenario).
        self._scenario_by_tenant = bool(scenarios.by_tenant)
        self.passthrough = PassThrough(settings, upstream, self.observer, self.metrics)
        if tracing is not None:
            tracing.server = upstream.server
        names = [b"idempotency-key", b"x-idempotency-key"]
        if settings.key_from_request_id:
            names.append(b"x-request-id")
        self._key_headers = tuple(names)
        self._tenants = Tenants(
            settings.tenant_header.lower().encode() if settings.tenant_header else None,
            credential_headers=(
                *DEFAULT_CREDENTIAL_HEADERS,
                *(name.encode() for name in settings.credential_header),
            ),
        )
        self.stopping = False  # set at SIGTERM (gateway/server.py)
        # Set at SIGTERM too, --shutdown-delay before ``stopping``: not ready.
        self.draining = False
        # Storage errors, answered with a fixed problem and logged for the operator.
        self.store_failures = StoreFailures(self.clock, settings.store)
        # Keyed runs this process owns, by (tenant, key): the single-flight table.
        self.running: RunTable[Execution] = RunTable()
        # Per-tenant limits (gateway/limits.py), None when not configured.
        self.in_flight, self.new_keys = limits_of(settings)
        if self.metrics is not None:
            self.metrics.count_runs(self.running)
        self.replays = ReplayCache(self.clock, settings.replay_cache)
        self.replay_counts = ReplayCounter()
        self._tasks: set[asyncio.Task[Any]] = set()
        # The run each request in progress started, by id(CallRecord): a request cut
        # at shutdown learns it from here, since its _proxy never returned.
        self._started: dict[int, Execution] = {}
        # Completions and releases that failed while the store was down, retried.
        self.pending = PendingWrites(self.clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan and websockets: nothing to do (the server runs lifespan="off")
        if scope["path"][:1] != "/":
            await self._asterisk(scope, send)
            return
        if scope["path"].startswith("/_payonce/"):
            try:
                await admin.handle(self, scope, receive, send)
            except ProblemError as exc:
                await problem_response(send, exc, scope["path"])
            except StorageError as exc:
                await problem_response(send, self.store_failures.answer(exc), scope["path"])
            except asyncio.CancelledError:  # a long poll (?wait=) open at shutdown
                if not self.stopping:
                    raise
                await self._cut_at_shutdown(None, send, scope["path"])
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        # The tenant hash is needed by keyed requests and by the call log and spans.
        observer = self.observer
        logged = (
            observer.call_log is not None
            or observer.tracing is not None
            or self._scenario_by_tenant
        )
        tenant = self._tenants.of(headers) if logged else ""
        record = observer.start(scope["method"], scope["path"], tenant, headers)
        send = self.observer.wrap_send(send, record)
        run: Execution | None = None
        cut = False
        try:
            run = await self._proxy(scope, receive, send, record)
        except ClientGone:
            record.outcome, record.status = "rejected", 499
            record.client_disconnected = True
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            # The run this request started goes on (drain): its line waits for it.
            run, cut = self._started.get(id(record)), True
            await self._cut_at_shutdown(record, send, scope["path"])
        except (ProblemError, StorageError) as exc:
            # A store's own message names the store: callers get a fixed problem
            # and the operator's log the message (gateway/store_failures.py).
            error = exc if isinstance(exc, ProblemError) else self.store_failures.answer(exc)
            record.outcome = outcome_of(error)
            if isinstance(error, TenantLimited):
                observer.limited(error)
            if record.response_started:
                # An unkeyed stream whose upstream died, or a stored stream the
                # store stopped giving: its head is gone, so the client can only
                # be shown a broken body.
                break_response(error.detail)
            else:
                await problem_response(send, error, scope["path"])
        except Exception as exc:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            if record.response_started:
                break_response(f"unexpected {exc.__class__.__name__}")
            else:
                error = ProblemError("the gateway failed unexpectedly; see its log")
                await problem_response(send, error, scope["path"])
        finally:
            reason = broken_reason()
            if reason is not None:
                # A keyed run logs its own upstream failure once, however many
                # clients follow it; an unkeyed one has only this line.
                log.log(
                    logging.WARNING if record.key is None else logging.DEBUG,
                    "%s %s%s: the upstream response broke off %s; the client got a broken stream",
                    scope["method"],
                    scope["path"],
                    f" (Idempotency-Key {record.key!r})" if record.key is not None else "",
                    reason,
                )
            self._started.pop(id(record), None)
            self._finish(record, receive, run, cut=cut)

    @staticmethod
    async def _cut_at_shutdown(record: CallRecord | None, send: Send, path: str) -> None:
        # uvicorn cancels the requests still open 5 s after SIGTERM. A keyed run goes
        # on (drain) and stores its answer: its client is told to retry, rather than
        # handed uvicorn's bare 500 (or a reset) and a traceback in the log.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        error = ShuttingDown(
            "the gateway is shutting down; a request with an Idempotency-Key goes on"
            " running and its answer is kept: retry with the same key",
            retry_after=1,
        )
        if record is not None:
            record.outcome = outcome_of(error)
        if record is not None and record.response_started:
            break_response(error.detail)
        else:
            await problem_response(send, error, path)

    def _finish(
        self, record: CallRecord, receive: Receive, run: Execution | None, *, cut: bool = False
    ) -> None:
        """Log and count a request as what its client received (docs/call-log.md).

        ``cut``: answered 503 at shutdown while its run goes on (the drain)."""
        left = client_left(receive)
        if left:
            # Whatever was sent after it left went nowhere: nginx's 499.
            record.status, record.client_disconnected = 499, True
        if left or cut:
            task = run.task if run is not None else None
            if task is not None and not task.done():
                # A run whose client left, or was told to retry at shutdown, goes
                # on for the retry: its line waits for the run, so it says what the
                # call did upstream and cost.
                finished = time.perf_counter()

                def settled(_: object) -> None:
                    assert run is not None
                    self.observer.apply(record, run.facts, saved=False)
                    self.observer.finish(record, finished)

                task.add_done_callback(settled)
                return
        self.observer.finish(record)

    @staticmethod
    async def _asterisk(scope: Scope, send: Send) -> None:
        # The asterisk form (RFC 9112 section 3.2.4) asks about the server, not a
        # resource: no upstream URL can be built from it, so the gateway answers.
        if scope["method"] == "OPTIONS" and scope["path"] == "*":
            await send_response(send, 200, [_ALLOW], b"")
            return
        error = BadRequestTarget(
            f"{scope['method']} {scope['path']!r}: the request target must be a path"
            " (only OPTIONS may use '*')"
        )
        await problem_response(send, error)

    def tenant(self, headers: list[tuple[bytes, bytes]]) -> str:
        return self._tenants.of(headers)

    async def _proxy(
        self, scope: Scope, receive: Receive, send: Send, record: CallRecord
    ) -> Execution | None:
        """Answer one proxied request; returns the keyed run it started, if any."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        key = read_key(headers, self._key_headers)
        if key is None and self.settings.require_key:
            raise IdempotencyKeyRequired(
                "this gateway requires an Idempotency-Key header on every request"
            )
        if key is not None and scope["method"] == "HEAD":
            # A HEAD is safe (RFC 9110 section 9.2.1): it changes nothing upstream,
            # bills nothing and has no body to store. It is forwarded as if it had
            # no key: nothing claimed or stored, so the same key on the GET or POST
            # it probes is a new key there, not a 422 against a stored HEAD.
            key = None
        record.key = key
        if key is not None and self.settings.require_credential:
            # Before the body is read: nothing of an anonymous keyed request is used.
            record.tenant = record.tenant or self.tenant(headers)
            if record.tenant == ANONYMOUS:
                raise CredentialRequired(
                    "this gateway requires a credential (Authorization, x-api-key, api-key,"
                    " x-goog-api-key or a --credential-header) on requests with an"
                    " Idempotency-Key"
                )
        attempt = None
        if key is None and scope["method"] == "POST":
            attempt = sdk_attempt(self.settings, record.client_retry, headers)
        if (key is not None or attempt is not None) and self.in_flight is not None:
            # A slot of --max-inflight-per-tenant, taken before the body is read.
            record.tenant = record.tenant or self.tenant(headers)
            answer = functools.partial(self._request, key, scope, receive, send, record, attempt)
            return await in_a_slot(self.in_flight, record.tenant, answer)
        return await self._request(key, scope, receive, send, record, attempt)

    async def _request(
        self,
        key: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        record: CallRecord,
        attempt: SdkAttempt | None = None,
    ) -> Execution | None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        body = await read_body(receive, headers, self.settings.max_body)
        raw_path = scope.get("raw_path") or scope["path"].encode()
        request = ProxiedRequest(
            method=scope["method"],
            raw_path=raw_path.decode("latin-1"),
            query=scope["query_string"].decode("latin-1"),
            headers=headers,
            body=body,
            write_body=body_writer(scope),
        )
        record.model = model_of(body)
        if key is None and attempt is not None:
            record.tenant = record.tenant or self.tenant(headers)
            if record.tenant == ANONYMOUS:
                attempt = None  # no credential: nothing says two attempts are one caller's
        if key is None and attempt is None:
            record.outcome = "passthrough"
            await self.passthrough.forward(request, receive, send, record)
            return None
        return await self._keyed(key, request, receive, send, record, attempt)

    async def _keyed(
        self,
        key: str | None,
        request: ProxiedRequest,
        receive: Receive,
        send: Send,
        record: CallRecord,
        attempt: SdkAttempt | None = None,
    ) -> Execution | None:
        """A keyed request, one claim outcome at a time (the state machine in the
        module docstring). Each handler names what it answered with in ``seen``
        before it sends; it is observed once, here, however the answer ends.

        Without a key, an SDK's ``attempt`` is keyed by its fingerprint, its record
        kept for the attempt's window (gateway/sdk_retries.py)."""
        tenant = record.tenant = record.tenant or self.tenant(request.headers)
        print_ = fingerprint(
            request.method,
            request.raw_path + ("?" + request.query if request.query else ""),
            request.body,
            header(request.headers, b"content-type"),
        )
        ttl = self.settings.ttl
        if key is None:
            assert attempt is not None
            key, ttl = implicit_key(print_), attempt.window
            record.sdk_match = attempt.match
        resume = _last_event_id(request.headers)
        if resume is not None:
            # Before the replay cache: a resume is answered from its run or refused,
            # the same on every replica, whatever each one has cached.
            await self._resume(tenant, key, print_, resume, request, receive, send, record)
            return None
        seen = _Seen()
        first = attempt is not None and attempt.first
        try:
            return await self._claimed(
                tenant, key, print_, request, receive, send, record, seen, ttl=ttl, first=first
            )
        finally:
            if seen.facts is not None:
                self.observer.apply(record, seen.facts, saved=seen.saved)

    async def _claimed(
        self,
        tenant: str,
        key: str,
        print_: str,
        request: ProxiedRequest,
        receive: Receive,
        send: Send,
        record: CallRecord,
        seen: _Seen,
        *,
        ttl: float,
        first: bool = False,
    ) -> Execution | None:
        """``first``: an SDK's first attempt, which runs only as its body's first call
        (else on its own, unrecorded: :meth:`_on_its_own`)."""
        cached = self.replays.get(tenant, key)
        if cached is not None:
            if first:
                await self._on_its_own(request, receive, send, record)
                return None
            if cached.fingerprint != print_:
                raise _mismatch(key)
            self.replay_counts.add(tenant, key)
            record.outcome = "replayed"
            seen.facts, seen.saved = cached.facts, True
            await _send_replay(send, cached)
            return None
        settings = self.settings
        deadline = asyncio.get_running_loop().time() + settings.wait_timeout
        while True:
            local = self.running.get(tenant, key)
            if local is not None:
                if first:
                    await self._on_its_own(request, receive, send, record)
                    return None
                await self._join_here(local, print_, deadline, request, receive, send, record, seen)
                return None
            if self.new_keys is not None and not self.new_keys.allows(tenant):
                await refuse_new_key(self.new_keys, self.store, tenant, key)
            try:
                claim = await self.store.claim(tenant, key, print_, lease=settings.lease, ttl=ttl)
            except StorageError as exc:
                await self.passthrough.forward_unprotected(request, receive, send, record, exc)
                return None
            status, stored = claim.status, claim.record
            if status is ClaimStatus.ACQUIRED:
                return await self._acquired(stored, request, receive, send, record, seen, ttl)
            if first:
                await self._on_its_own(request, receive, send, record)
                return None
            if status is ClaimStatus.MISMATCH:
                raise _mismatch(key)
            if stored.streaming:
                # Completed, or being recorded by another process: its events.
                completed = status is ClaimStatus.COMPLETED
                await self._follow_recorded(stored, completed, request, receive, send, record, 0)
                return None
            if status is ClaimStatus.COMPLETED:
                await self._completed(stored, send, record, seen)
                return None
            if (tenant, key) in self.running:
                # In progress here after all: its claim shared this one's group
                # commit and won, and it started running since. Join it.
                continue
            # In progress in another process: wait for it, then claim again
            # (a release or a lapsed lease lets this request run it).
            try:
                await self._wait_elsewhere(stored, deadline)
            except StorageError as exc:
                await self.passthrough.forward_unprotected(request, receive, send, record, exc)
                return None

    async def _join_here(
        self,
        local: Execution,
        print_: str,
        deadline: float,
        request: ProxiedRequest,
        receive: Receive,
        send: Send,
        record: CallRecord,
        seen: _Seen,
    ) -> None:
        """The key runs in this process: follow its run."""
        if local.fingerprint != print_:
            raise _mismatch(local.key)
        if self.observer.tracing is not None:
            self.observer.tracing.joined(record, local.facts)
        head = await self._joined(local, deadline)
        record.outcome = "joined"
        seen.facts, seen.saved = local.facts, True
        await self._answer(send, receive, request, head, _JOINED, 0, local)

    async def _acquired(
        self,
        claimed: Record,
        request: ProxiedRequest,
        receive: Receive,
        send: Send,
        record: CallRecord,
        seen: _Seen,
        ttl: float,
    ) -> Execution:
        """This request won the key: run it upstream, and answer from the run."""
        if self.new_keys is not None:
            self.new_keys.spend(claimed.tenant)
        record.outcome = "forwarded"
        execution = self._execute(claimed, request, ttl)
        self._started[id(record)] = execution
        if self.observer.tracing is not None:
            self.observer.tracing.start_upstream(execution.facts, record)
        seen.facts, seen.saved = execution.facts, False
        head = await asyncio.shield(execution.head)
        await self._answer(
            send, receive, request, head, _NOT_REPLAYED, 0, execution, execution.facts
        )
        return execution

    async def _on_its_own(
        self, request: ProxiedRequest, receive: Receive, send: Send, record: CallRecord
    ) -> None:
        """An SDK's first attempt while another call with its body runs or was just
        answered: a business request of its own, forwarded unrecorded (its retries
        will meet the other call's record: docs/gateway.md, "SDK retries without a key")."""
        record.sdk_match = "on_its_own"
        record.outcome = "passthrough"
        await self.passthrough.forward(request, receive, send, record)

    async def _completed(self, stored: Record, send: Send, record: CallRecord, seen: _Seen) -> None:
        """The key has its whole answer in the store: replay it (and keep it cached)."""
        facts = stored_facts(stored)
        self.replay_counts.add(stored.tenant, stored.key)
        assert stored.response is not None
        entry = self.replays.put(
            stored.tenant, stored.key, stored.fingerprint, stored.expires_at, stored.response, facts
        )
        record.outcome = "replayed"
        seen.facts, seen.saved = facts, True
        await _send_replay(send, entry)

    async def _wait_elsewhere(self, stored: Record, deadline: float) -> None:
        """The key runs in another process: wait for its record to change, or refuse
        past ``--wait-timeout`` (the client retries later with the same key)."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            lease_left = stored.lease_expires_at - self.clock.now()
            raise RequestInProgress(
                f"a request with Idempotency-Key {stored.key!r} is still running; retry later",
                retry_after=max(1.0, min(lease_left, 30.0)),
            )
        await self.store.wait(stored.tenant, stored.key, remaining)

    async def _resume(
        self,
        tenant: str,
        key: str,
        print_: str,
        resume: LastEventId,
        request: ProxiedRequest,
        receive: Receive,
        send: Send,
        record: CallRecord,
    ) -> None:
        """Answer a ``Last-Event-ID`` resume from the run it names, or 412 (gateway/resume.py).

        It never claims the key: a resume must not start a run of its own.
        """
        deadline = asyncio.get_running_loop().time() + self.settings.wait_timeout
        run = await find_run(self.running, self.store, self.clock, tenant, key, resume, deadline)
        if run.fingerprint != print_:
            raise _mismatch(key)
        if isinstance(run, Record):
            completed = run.state is RecordState.COMPLETED
            await self._follow_recorded(
                run, completed, request, receive, send, record, resume.after
            )
            return
        head = await self._joined(run, deadline)
        record.outcome = "joined"
        try:
            await self._answer(send, receive, request, head, _JOINED, resume.after, run)
        finally:
            self.observer.apply(record, run.facts, saved=True)

    async def _follow_recorded(
        self,
        stored: Record,
        completed: bool,
        request: ProxiedRequest,
        receive: Receive,
        send: Send,
        record: CallRecord,
        after: int,
    ) -> None:
        """Relay a recorded stream's events after ``after``: completed, or still recorded
        by another process (then followed until it completes or its run is gone)."""
        tenant, key = stored.tenant, stored.key
        facts = stored_facts(stored)
        self.replay_counts.add(tenant, key)
        record.outcome = "replayed" if completed else "joined"
        if facts.usage is None and not_asked_for_usage(
            request.raw_path, request.body, self.settings.inject_stream_usage
        ):
            facts.usage_missing = "not_requested"
        if facts.request_id is None and after:
            # Resumed: the first events, which carry the provider's id, are not relayed.
            facts.request_id = await stored_request_id(self.store, stored)
        # Without a request-id header, the id is in the events relayed first.
        stream_id = StreamId() if facts.request_id is None else None
        self.observer.apply(record, facts, saved=True)
        try:
            await relay_stored(
                send,
                receive,
                self.store,
                stored,
                _JOINED,
                after,
                clock=self.clock,
                seen=stream_id.feed_events if stream_id is not None else None,
            )
        finally:
            if stream_id is not None:
                record.upstream_request_id = stream_id.value

    async def _answer(
        self,
        send: Send,
        receive: Receive,
        request: ProxiedRequest,
        head: Head,
        marker: tuple[bytes, bytes],
        after: int,
        execution: Execution,
        facts: UpstreamFacts | None = None,
    ) -> None:
        if isinstance(head, ProblemError):
            raise head
        if isinstance(head, LiveStream):
            left = await relay_live(
                send, receive, head, marker, after, execution.lease.token, request.write_body
            )
            if (
                left
                and self.settings.on_stream_disconnect == "cancel"
                and head.followers == 0
                and not head.finished
                and execution.task is not None
            ):
                # Nobody is reading and the operator prefers not paying for the
                # rest: stop it upstream and release the key (a retry runs again).
                log.info("every client of stream %r left: cancelling it", execution.key)
                execution.task.cancel()
            elif left and is_implicit(execution.key) and execution.task is not None:
                # An SDK's stream without a key: kept for its retry's backoff, then
                # stopped upstream if nobody came back (gateway/sdk_retries.py).
                loop = asyncio.get_running_loop()
                loop.call_later(STREAM_GRACE, _cancel_unread, head, execution)
        elif facts is not None and facts.cost_usd is not None:
            await send_whole(send, head, marker, (b"x-payonce-cost-usd", b"%.8f" % facts.cost_usd))
        else:
            await send_whole(send, head, marker)

    async def _joined(self, run: Execution, deadline: float) -> Head:
        """Wait for ``run``'s head as one of its duplicates, counted among its replays.

        Counted while waiting, so that a run completing meanwhile stores the count;
        uncounted if the wait ends without a head (shut down, timed out, cancelled):
        that duplicate got no answer from the record, and the status endpoint and the
        call log must agree (found by ``payonce torture``: a duplicate cut by the
        graceful shutdown was stored as a replay).
        """
        run.joined += 1
        try:
            return await self._join(run, deadline)
        except BaseException:
            run.joined -= 1
            raise

    async def _join(self, execution: Execution, deadline: float) -> Head:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(asyncio.shield(execution.head), max(0.0, remaining))
        except TimeoutError:
            raise RequestInProgress(
                f"a request with Idempotency-Key {execution.key!r} is still running; retry later",
                retry_after=max(1.0, math.ceil(self.settings.lease / 3)),
            ) from None

    def _execute(self, claimed: Record, request: ProxiedRequest, ttl: float) -> Execution:
        lease = Lease.of(
            self.store,
            claimed,
            clock=self.clock,
            duration=self.settings.lease,
            ttl=ttl,
            pending=self.pending,
        )
        execution = Execution(lease, claimed.fingerprint)
        self.running.start(execution)
        if self.metrics is not None and self.metrics.shared:
            self.metrics.runs_changed()
        task = asyncio.get_running_loop().create_task(self._run(execution, request))
        execution.task = task
        # Keep a reference: the task must outlive this request if the client leaves.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return execution

    async def _run(self, execution: Execution, request: ProxiedRequest) -> StoredResponse | None:
        stored = await run_execution(
            self.upstream,
            execution,
            request,
            running=self.running,
            inject_stream_usage=self.settings.inject_stream_usage,
            max_stored_body=self.settings.max_stored_body,
        )
        self.observer.upstream_call(execution.facts, request.raw_path)
        if stored is not None and not stored.stream:
            self.replays.put(
                execution.tenant,
                execution.key,
                execution.fingerprint,
                execution.lease.expires_at,
                stored,
                execution.facts,
            )
        return stored

    async def background(self) -> None:
        """The gateway's housekeeping: lease renewal, replay counts, purging expired records."""
        await housekeeping(
            renew_leases(self.running, self.settings.lease),
            self.store,
            self.pending,
            self.replays,
            self.replay_counts,
            self.observer.call_log,
            purge_every=min(60.0, self.settings.ttl / 10),
        )

    async def drain(self, grace: float, housekeeping: asyncio.Task[Any] | None = None) -> None:
        """At shutdown: let keyed runs finish for up to ``grace`` seconds, then cancel them.

        ``housekeeping`` (:meth:`background`) keeps renewing their leases meanwhile, or
        they would lapse mid-drain and another replica would run the calls again; it
        is stopped before the last writes, which it would otherwise race.
        """
        if self._tasks:
            log.info("waiting up to %.0fs for %d keyed upstream call(s)", grace, len(self._tasks))
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if housekeeping is not None:
            housekeeping.cancel()
            await asyncio.gather(housekeeping, return_exceptions=True)
        if len(self.pending):
            await self.pending.retry()
        await self.replay_counts.flush(self.store)
