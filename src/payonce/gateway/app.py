"""The gateway as a pure ASGI application: routing, pass-through and the keyed state machine.

Keyed request, in order (DESIGN.md, Outcomes)::

    parse key ─ bad ──────────────────────────────────────────► 400
    read body ─ too big ──────────────────────────────────────► 413
    replay cache hit ─ same fingerprint ──────────────────────► replay (no store call)
                     ─ other fingerprint ─────────────────────► 422
    same key running here? ─ same fingerprint ─► join ────────► its result
    store.claim ─ MISMATCH ───────────────────────────────────► 422
                ─ COMPLETED ──────────────────────────────────► replay
                ─ IN_PROGRESS (another process) ─► store.wait, claim again; past
                                                   --wait-timeout ──► 409 + Retry-After
                ─ ACQUIRED ─► run_execution (detached task) ──► upstream result
                ─ store down ─────────────────────────────────► 503
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Coroutine
from typing import Any

from payonce.clock import Clock, SystemClock
from payonce.config import GatewaySettings
from payonce.errors import (
    FingerprintMismatch,
    IdempotencyKeyRequired,
    ProblemError,
    RequestInProgress,
)
from payonce.gateway import admin
from payonce.gateway.asgi import ClientGone, Receive, Scope, Send, problem_response, read_body
from payonce.gateway.execution import Execution, Outcome, renew_leases, run_execution
from payonce.gateway.keys import fingerprint, read_key, tenant_of
from payonce.gateway.replays import CachedReplay, ReplayCache, ReplayCounter
from payonce.gateway.request import ProxiedRequest, header
from payonce.gateway.upstream import Upstream, UpstreamResponse
from payonce.store import ClaimStatus, Record, Store, StoredResponse

__all__ = ["Gateway"]

log = logging.getLogger("payonce.gateway")

_JOINED = (b"idempotent-replayed", b"true")
_NOT_REPLAYED = (b"idempotent-replayed", b"false")
_VIA = (b"via", b"1.1 payonce")
_REPLAY_FLUSH_SECONDS = 1.0


async def _send_response(
    send: Send, response: UpstreamResponse, marker: tuple[bytes, bytes]
) -> None:
    headers = [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers
    ]
    headers.append(marker)
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


async def _send_replay(send: Send, replay: CachedReplay) -> None:
    start, body = replay.messages
    await send(start)
    await send(body)


def _mismatch(key: str) -> FingerprintMismatch:
    return FingerprintMismatch(f"Idempotency-Key {key!r} was first used with a different request")


class Gateway:
    """The ASGI app. Holds no per-request state beyond the executions it runs."""

    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        upstream: Upstream,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.upstream = upstream
        self.clock = clock or SystemClock()
        names = [b"idempotency-key", b"x-idempotency-key"]
        if settings.key_from_request_id:
            names.append(b"x-request-id")
        self._key_headers = tuple(names)
        self._tenant_header = (
            settings.tenant_header.lower().encode() if settings.tenant_header else None
        )
        # Keyed runs this process owns, by (tenant, key): the single-flight table.
        self.running: dict[tuple[str, str], Execution] = {}
        self.replays = ReplayCache(self.clock, settings.replay_cache)
        self.replay_counts = ReplayCounter()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan and websockets: nothing to do (the server runs lifespan="off")
        try:
            if scope["path"].startswith("/_payonce/"):
                await admin.handle(self, scope, receive, send)
            else:
                await self._proxy(scope, receive, send)
        except ClientGone:
            return
        except ProblemError as exc:
            await problem_response(send, exc, scope["path"])
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            error = ProblemError("the gateway failed unexpectedly; see its log")
            await problem_response(send, error, scope["path"])

    def tenant(self, headers: list[tuple[bytes, bytes]]) -> str:
        return tenant_of(headers, self._tenant_header)

    async def _proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        key = read_key(headers, self._key_headers)
        if key is None and self.settings.require_key:
            raise IdempotencyKeyRequired(
                "this gateway requires an Idempotency-Key header on every request"
            )
        body = await read_body(receive, headers, self.settings.max_body)
        raw_path = scope.get("raw_path") or scope["path"].encode()
        request = ProxiedRequest(
            method=scope["method"],
            raw_path=raw_path.decode("latin-1"),
            query=scope["query_string"].decode("latin-1"),
            headers=headers,
            body=body,
        )
        if key is None:
            await self._pass_through(request, receive, send)
        else:
            await self._keyed(key, request, send)

    async def _pass_through(self, request: ProxiedRequest, receive: Receive, send: Send) -> None:
        call = self.upstream.send(
            request.method,
            request.raw_path,
            request.query,
            request.upstream_headers(),
            request.body,
        )
        response: UpstreamResponse | None
        if self.settings.on_disconnect == "continue":
            response = await call
        else:
            response = await self._cancel_on_disconnect(call, receive)
        if response is not None:
            await _send_response(send, response, _VIA)

    @staticmethod
    async def _cancel_on_disconnect(
        call: Coroutine[Any, Any, UpstreamResponse], receive: Receive
    ) -> UpstreamResponse | None:
        # Without a key nobody can claim the result, so a client that leaves
        # should stop the generation (and its bill) where the provider allows.
        # The call runs in this task; one watcher task cancels it on disconnect.
        current = asyncio.current_task()
        assert current is not None
        gone = False

        def on_message(watcher: asyncio.Task[Any]) -> None:
            nonlocal gone
            if (
                not watcher.cancelled()
                and watcher.exception() is None
                and watcher.result()["type"] == "http.disconnect"
            ):
                gone = True
                current.cancel()

        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(on_message)
        try:
            return await call
        except asyncio.CancelledError:
            if not gone:
                raise
            current.uncancel()
            return None
        finally:
            watcher.remove_done_callback(on_message)
            watcher.cancel()

    async def _keyed(self, key: str, request: ProxiedRequest, send: Send) -> None:
        tenant = self.tenant(request.headers)
        print_ = fingerprint(
            request.method,
            request.raw_path + ("?" + request.query if request.query else ""),
            request.body,
            header(request.headers, b"content-type"),
        )
        cached = self.replays.get(tenant, key)
        if cached is not None:
            if cached.fingerprint != print_:
                raise _mismatch(key)
            self.replay_counts.add(tenant, key)
            await _send_replay(send, cached)
            return
        settings = self.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.wait_timeout
        while True:
            local = self.running.get((tenant, key))
            if local is not None:
                if local.fingerprint != print_:
                    raise _mismatch(key)
                local.joined += 1
                await self._send_outcome(send, await self._join(local, deadline), _JOINED)
                return
            claim = await self.store.claim(
                tenant, key, print_, lease=settings.lease, ttl=settings.ttl
            )
            if claim.status is ClaimStatus.ACQUIRED:
                outcome = await self._execute(claim.record, request)
                await self._send_outcome(send, outcome, _NOT_REPLAYED)
                return
            record = claim.record
            if claim.status is ClaimStatus.MISMATCH:
                raise _mismatch(key)
            if claim.status is ClaimStatus.COMPLETED:
                self.replay_counts.add(tenant, key)
                assert record.response is not None
                entry = self.replays.put(
                    tenant, key, record.fingerprint, record.expires_at, record.response
                )
                await _send_replay(send, entry)
                return
            # In progress in another process: wait for it, then claim again
            # (a release or a lapsed lease lets this request run it).
            remaining = deadline - loop.time()
            if remaining <= 0:
                lease_left = record.lease_expires_at - self.clock.now()
                raise RequestInProgress(
                    f"a request with Idempotency-Key {key!r} is still running; retry later",
                    retry_after=max(1.0, min(lease_left, 30.0)),
                )
            await self.store.wait(tenant, key, remaining)

    async def _join(self, execution: Execution, deadline: float) -> Outcome:
        assert execution.task is not None
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            outcome, _ = await asyncio.wait_for(asyncio.shield(execution.task), max(0.0, remaining))
        except TimeoutError:
            raise RequestInProgress(
                f"a request with Idempotency-Key {execution.key!r} is still running; retry later",
                retry_after=max(1.0, math.ceil(self.settings.lease / 3)),
            ) from None
        return outcome

    async def _execute(self, claimed: Record, request: ProxiedRequest) -> Outcome:
        execution = Execution(
            claimed.tenant, claimed.key, claimed.token, claimed.fingerprint, claimed.expires_at
        )
        self.running[(claimed.tenant, claimed.key)] = execution
        task = asyncio.get_running_loop().create_task(self._run(execution, request))
        execution.task = task
        # Keep a reference: the task must outlive this request if the client leaves.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        outcome, _ = await asyncio.shield(task)
        return outcome

    async def _run(
        self, execution: Execution, request: ProxiedRequest
    ) -> tuple[Outcome, StoredResponse | None]:
        outcome, stored = await run_execution(
            self.store, self.upstream, execution, request, running=self.running
        )
        if stored is not None:
            self.replays.put(
                execution.tenant, execution.key, execution.fingerprint, execution.expires_at, stored
            )
        return outcome, stored

    @staticmethod
    async def _send_outcome(send: Send, outcome: Outcome, marker: tuple[bytes, bytes]) -> None:
        if isinstance(outcome, ProblemError):
            raise outcome
        await _send_response(send, outcome, marker)

    async def background(self) -> None:
        """The gateway's housekeeping: lease renewal, replay counts, purging expired records."""
        loops = [
            renew_leases(self.store, self.running, self.settings.lease),
            self._flush_replay_counts(),
            self._purge_expired(min(60.0, self.settings.ttl / 10)),
        ]
        await asyncio.gather(*loops)

    async def _flush_replay_counts(self) -> None:
        while True:
            await asyncio.sleep(_REPLAY_FLUSH_SECONDS)
            await self.replay_counts.flush(self.store)

    async def _purge_expired(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                purged = await self.store.purge_expired()
            except ProblemError as exc:
                log.warning("purging expired records failed: %s", exc)
                continue
            if purged:
                log.debug("purged %d expired records", purged)

    async def drain(self, grace: float) -> None:
        """At shutdown: let keyed runs finish for up to ``grace`` seconds, then cancel them."""
        if self._tasks:
            log.info("waiting up to %.0fs for %d keyed upstream call(s)", grace, len(self._tasks))
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        await self.replay_counts.flush(self.store)
