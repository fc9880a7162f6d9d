"""The gateway's own endpoints under ``/_payonce/``.

Records are read with the caller's credential: the tenant hash of the request
decides which records it can see, so one tenant can never read another's
result by guessing its key (draft-ietf-httpapi-idempotency-key-header, section 6).
"""

from __future__ import annotations

import asyncio
import hmac
import math
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from payonce.errors import (
    Abandoned,
    BadQuery,
    CredentialRequired,
    MethodNotAllowed,
    NotFound,
    ProblemError,
    RequestInProgress,
    StorageError,
    Unauthorized,
)
from payonce.gateway.asgi import (
    Receive,
    Scope,
    Send,
    client_left,
    send_json,
    send_response,
)
from payonce.gateway.keys import ANONYMOUS, parse_path_key
from payonce.gateway.live import LiveStream
from payonce.gateway.observing import outcome_of, stored_facts, stored_request_id
from payonce.gateway.openapi import MAX_WAIT, openapi_json
from payonce.gateway.relay import relay_stored, send_whole
from payonce.observe.metrics import CONTENT_TYPE_LATEST
from payonce.store import Record, RecordState

if TYPE_CHECKING:
    from payonce.gateway.app import Gateway
    from payonce.gateway.execution import Execution

__all__ = ["ALLOWED_METHODS", "ROUTES", "handle", "record_document"]

REPLAYED = (b"idempotent-replayed", b"true")


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return (
        datetime.fromtimestamp(timestamp, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


ABANDONED = "abandoned"


def record_document(record: Record, now: float) -> dict[str, object]:
    """The status document of one record at ``now`` (docs/gateway.md, its own endpoints).

    ``state`` is ``in_progress``, ``completed``, or ``abandoned``: in progress
    but its lease lapsed (its holder died or froze), so nobody runs it and a
    re-send with the same key runs it again.
    """
    return {
        "key": record.key,
        "state": ABANDONED if record.lease_lapsed(now) else record.state.value,
        "status_code": record.response.status if record.response else None,
        "created_at": _iso(record.created_at),
        "completed_at": _iso(record.completed_at),
        "replays": record.replays,
        "usage": dict(record.usage) if record.usage is not None else None,
        "cost_usd": record.cost_usd,
        # The provider's id of the call (read from the stored response by the caller).
        "upstream_request_id": None,
        # A stream's progress: events recorded so far (null for a whole response).
        "events": record.events if record.streaming else None,
    }


def _check_metrics_token(gateway: Gateway, headers: list[tuple[bytes, bytes]]) -> None:
    # Metrics are aggregates (no tenant, no key), so they are open unless the
    # operator sets --metrics-token; then scrapers send it as a bearer token.
    token = gateway.settings.metrics_token
    if token is None:
        return
    expected = b"Bearer " + token.encode()
    for name, value in headers:
        if name == b"authorization" and hmac.compare_digest(value, expected):
            return
    raise Unauthorized("GET /_payonce/metrics needs Authorization: Bearer <--metrics-token>")


def _wait_seconds(query: bytes) -> float:
    values = parse_qs(query.decode("latin-1")).get("wait")
    if not values:
        return 0.0
    try:
        seconds = float(values[-1])
    except ValueError:
        raise BadQuery(f"wait={values[-1]!r} is not a number of seconds") from None
    if not 0 <= seconds <= MAX_WAIT or math.isnan(seconds):
        raise BadQuery(f"wait must be between 0 and {MAX_WAIT:.0f} seconds")
    return seconds


async def _lookup(gateway: Gateway, tenant: str, key: str, wait: float) -> Record:
    # ``wait``: until the record changes (Store.wait: completed, released, new
    # events, taken over, or its lease lapsed) or ``wait`` seconds pass. A record
    # nobody runs (completed, abandoned) is answered at once: nothing will change it.
    # Only ever the caller's own (tenant, key): another tenant's key and a key
    # nobody used then take the same path and time (tests/gateway/test_status_probe.py).
    record = await gateway.store.get(tenant, key)
    if record is not None and record.state is RecordState.IN_PROGRESS and wait > 0:
        local = gateway.running.get(tenant, key)
        if local is not None:
            await _local_change(local, wait)
            record = await gateway.store.get(tenant, key)
        else:
            record = await gateway.store.wait(tenant, key, wait)
    if record is None:
        # Never seen, expired, or released after a failure: a retry with this key runs again.
        raise NotFound(f"no record for Idempotency-Key {key!r} for this credential")
    return record


async def _local_change(run: Execution, wait: float) -> None:
    """Until the run this process owns changes, or ``wait`` seconds pass.

    A change is what the store would show another process: the run ends
    (completed or released), its stream begins, or its stream has events past
    those it had when the wait began. A stream that has ended but is not yet
    completed in the store waits for its run, so the answer says ``completed``.
    The run's task is awaited through :func:`asyncio.wait`, never cancelled.
    """
    task = run.task
    assert task is not None  # set as the run starts, before it is in the table
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    live = run.head_value
    seen = live.total if isinstance(live, LiveStream) else None
    change: asyncio.Future[Any]
    while not task.done():
        live = run.head_value
        if isinstance(live, LiveStream):
            if seen is None or live.total > seen:
                return  # the stream began, or has new events
            change = task if live.finished else asyncio.ensure_future(live.changed())
        elif run.head.done():
            change = task  # a whole answer: changed when it is stored (or released)
        else:
            change = run.head  # not begun: its head, or its end, is the change
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        try:
            await asyncio.wait({change, task}, timeout=remaining, return_when=FIRST_COMPLETED)
        finally:
            if change is not task and change is not run.head:
                change.cancel()  # only the waiter made here


Handler = Callable[["Gateway", Scope, Receive, Send, str], Awaitable[None]]

# GET and HEAD only: what a 405 names in its Allow header (RFC 9110 section 15.5.6).
ALLOWED_METHODS = ("GET", "HEAD")


async def _metrics(gateway: Gateway, scope: Scope, receive: Receive, send: Send, _: str) -> None:
    if gateway.metrics is None:  # --no-metrics
        raise NotFound(f"{scope['path']}: metrics are off (--no-metrics)")
    _check_metrics_token(gateway, scope["headers"])
    body = gateway.metrics.render()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE_LATEST.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _health(gateway: Gateway, scope: Scope, receive: Receive, send: Send, _: str) -> None:
    try:
        await gateway.store.ping()
    except StorageError as exc:
        if gateway.settings.on_store_failure != "open":
            raise  # answered at the edge, without the store's own words (gateway/app.py)
        gateway.store_failures.note(exc, "health answered degraded")
        # Still serving, unprotected: a load balancer must not take every replica out.
        await send_json(send, 200, {"status": "degraded", "store": "unavailable"})
        return
    await send_json(send, 200, {"status": "ok", "store": "ok"})


async def _live(gateway: Gateway, scope: Scope, receive: Receive, send: Send, _: str) -> None:
    # Liveness: the process and its event loop answer. Nothing else is checked,
    # so a store outage never gets the gateway restarted (docs/deploy.md, probes).
    await send_json(send, 200, {"status": "ok"})


def _wants_upstream(query: bytes) -> bool:
    values = parse_qs(query.decode("latin-1")).get("upstream")
    if not values:
        return False
    value = values[-1].lower()
    if value not in ("true", "false", "1", "0"):
        raise BadQuery(f"upstream={values[-1]!r} must be true or false")
    return value in ("true", "1")


async def _ready(gateway: Gateway, scope: Scope, receive: Receive, send: Send, _: str) -> None:
    # Readiness: whether to send this gateway requests. 503 while draining (from
    # SIGTERM on), when the store does not answer (with --on-store-failure open
    # the gateway still serves: 200, degraded, like /_payonce/health), and with
    # ?upstream=true when no TCP connection to the upstream opens.
    upstream = _wants_upstream(scope["query_string"])
    document: dict[str, object] = {"status": "ok", "store": "ok"}
    if upstream:
        document["upstream"] = "ok"
    ready = True
    if gateway.draining:
        document["status"], ready = "draining", False
    try:
        await gateway.store.ping()
    except StorageError as exc:
        document["store"] = "unavailable"
        if gateway.settings.on_store_failure == "open":
            gateway.store_failures.note(exc, "readiness answered degraded")
            if ready:
                document["status"] = "degraded"
        else:
            gateway.store_failures.note(exc, "readiness answered not ready")
            if ready:
                document["status"], ready = "unavailable", False
    if upstream and not await gateway.upstream.reachable():
        document["upstream"] = "unavailable"
        if ready:
            document["status"], ready = "unavailable", False
    await send_json(send, 200 if ready else 503, document)


async def _openapi(gateway: Gateway, scope: Scope, receive: Receive, send: Send, _: str) -> None:
    await send_response(send, 200, [(b"content-type", b"application/json")], openapi_json())


def _tenant_and_wait(gateway: Gateway, scope: Scope) -> tuple[str, float]:
    tenant = gateway.tenant(scope["headers"])  # the same tenant as keyed requests
    if tenant == ANONYMOUS and gateway.settings.require_credential:
        raise CredentialRequired("send the credential the request was made with")
    return tenant, _wait_seconds(scope["query_string"])


async def _status(gateway: Gateway, scope: Scope, receive: Receive, send: Send, key: str) -> None:
    tenant, wait = _tenant_and_wait(gateway, scope)
    record = await _lookup(gateway, tenant, key, wait)
    document = record_document(record, gateway.clock.now())
    local = gateway.running.get(tenant, key)
    if local is not None and local.facts.request_id is not None:
        document["upstream_request_id"] = local.facts.request_id
    else:
        document["upstream_request_id"] = await stored_request_id(gateway.store, record)
    if local is not None and isinstance(local.head_value, LiveStream):
        # Fresher than the store, which is written in batches: every event the
        # upstream sent so far (what its clients have, or are being sent), not
        # the window still in memory, which shrinks as batches are stored.
        document["events"] = local.head_value.total
    document["replays"] = record.replays + gateway.replay_counts.pending(tenant, key)
    await send_json(send, 200, document)


async def _response(gateway: Gateway, scope: Scope, receive: Receive, send: Send, key: str) -> None:
    tenant, wait = _tenant_and_wait(gateway, scope)
    record = await _lookup(gateway, tenant, key, wait)
    if record.lease_lapsed(gateway.clock.now()):
        raise Abandoned(
            f"the request with Idempotency-Key {key!r} has no response and nobody"
            " is running it (its gateway stopped renewing the lease): re-send it"
            " with the same key"
        )
    if record.response is None or (
        record.state is RecordState.IN_PROGRESS and not record.streaming
    ):
        raise RequestInProgress(
            f"the request with Idempotency-Key {key!r} has no response yet",
            retry_after=1,
        )
    await _deliver(gateway, scope, receive, send, record)


async def _deliver(
    gateway: Gateway, scope: Scope, receive: Receive, send: Send, record: Record
) -> None:
    """Send a stored answer, and log and count it as the answer its client received.

    A client whose attempt timed out fetches the answer here instead of re-sending
    (payonce.client does): the call log, the metrics and ``payonce reconcile`` must
    see that its business request was answered, or they count it as failed
    (docs/call-log.md, "Fetched answers"). Lookups that deliver nothing (404, 409,
    410) are questions, like the status endpoint's, and are not logged.
    """
    response = record.response
    assert response is not None  # checked by the caller
    observer = gateway.observer
    call = observer.start(scope["method"], scope["path"], record.tenant, scope["headers"])
    call.key, call.outcome = record.key, "replayed"
    facts = stored_facts(record)
    if facts.request_id is None and record.streaming:
        facts.request_id = await stored_request_id(gateway.store, record)
    observer.apply(call, facts, saved=True)
    gateway.replay_counts.add(record.tenant, record.key)
    observed = observer.wrap_send(send, call)
    try:
        if record.streaming:
            await relay_stored(
                observed, receive, gateway.store, record, REPLAYED, after=0, clock=gateway.clock
            )
        else:
            await send_whole(observed, response, REPLAYED)
    except ProblemError as exc:
        call.outcome = outcome_of(exc)
        if not call.response_started:
            call.status = exc.status
        raise
    finally:
        if client_left(receive):
            call.status, call.client_disconnected = 499, True
        observer.finish(call)


# Every endpoint under /_payonce/, by its path template: the dispatch table, and
# what the OpenAPI description (gateway/openapi.py) must list, path for path.
ROUTES: dict[str, Handler] = {
    "/_payonce/health": _health,
    "/_payonce/health/live": _live,
    "/_payonce/health/ready": _ready,
    "/_payonce/metrics": _metrics,
    "/_payonce/openapi.json": _openapi,
    "/_payonce/requests/{key}": _status,
    "/_payonce/requests/{key}/response": _response,
}
_TEMPLATES = tuple((template.split("/")[2:], handler) for template, handler in ROUTES.items())


def _route(parts: list[str]) -> tuple[Handler, str] | None:
    """The handler of a path's segments after ``/_payonce/``, and the raw ``{key}`` in it."""
    for segments, handler in _TEMPLATES:
        if len(segments) != len(parts):
            continue
        key = ""
        for template, part in zip(segments, parts, strict=True):
            if template == "{key}" and part:
                key = part
            elif template != part:
                break
        else:
            return handler, key
    return None


async def handle(gateway: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    path: str = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    if scope["method"] not in ALLOWED_METHODS:
        raise MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}")
    found = _route(path.split("/")[2:])  # after "", "_payonce"
    if found is None:
        raise NotFound(f"{scope['path']} is not a payonce endpoint")
    handler, raw_key = found
    await handler(gateway, scope, receive, send, parse_path_key(raw_key) if raw_key else "")
