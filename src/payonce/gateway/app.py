"""The gateway as a pure ASGI application: routing, pass-through and the keyed state machine.

Keyed request, in order (DESIGN.md, Outcomes)::

    parse key ─ bad ──────────────────────────────────────────► 400
    read body ─ too big ──────────────────────────────────────► 413
    same key running here?  ─ same fingerprint ─► join ───────► its result
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
from payonce.gateway.execution import Execution, Outcome, run_execution
from payonce.gateway.keys import fingerprint, read_key, tenant_of
from payonce.gateway.request import ProxiedRequest, header
from payonce.gateway.upstream import Upstream, UpstreamResponse
from payonce.store import ClaimStatus, Store, StoredResponse

__all__ = ["Gateway"]

log = logging.getLogger("payonce.gateway")

_REPLAYED = (b"idempotent-replayed", b"true")
_NOT_REPLAYED = (b"idempotent-replayed", b"false")


def _encode(headers: tuple[tuple[str, str], ...]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def _send_stored(
    send: Send, response: UpstreamResponse | StoredResponse, marker: tuple[bytes, bytes]
) -> None:
    headers = _encode(response.headers)
    headers.append(marker)
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


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
        self._tasks: set[asyncio.Task[None]] = set()

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
        if response is None:
            return
        await _send_stored(send, response, (b"via", b"1.1 payonce"))

    @staticmethod
    async def _cancel_on_disconnect(
        call: Coroutine[Any, Any, UpstreamResponse], receive: Receive
    ) -> UpstreamResponse | None:
        # Without a key nobody can claim the result, so a client that leaves
        # should stop the generation (and its bill) where the provider allows.
        upstream = asyncio.ensure_future(call)
        watcher = asyncio.ensure_future(receive())
        done, _ = await asyncio.wait({upstream, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if upstream in done:
            watcher.cancel()
            return upstream.result()
        upstream.cancel()
        return None

    async def _keyed(self, key: str, request: ProxiedRequest, send: Send) -> None:
        tenant = self.tenant(request.headers)
        print_ = fingerprint(
            request.method,
            request.raw_path + ("?" + request.query if request.query else ""),
            request.body,
            header(request.headers, b"content-type"),
        )
        settings = self.settings
        deadline = asyncio.get_running_loop().time() + settings.wait_timeout
        while True:
            local = self.running.get((tenant, key))
            if local is not None:
                if local.fingerprint != print_:
                    raise FingerprintMismatch(
                        f"Idempotency-Key {key!r} was first used with a different request"
                    )
                local.joined += 1
                outcome = await self._await_local(local, deadline)
                await self._send_outcome(send, outcome, _REPLAYED)
                return
            claim = await self.store.claim(
                tenant, key, print_, lease=settings.lease, ttl=settings.ttl
            )
            if claim.status is ClaimStatus.ACQUIRED:
                outcome = await self._execute(tenant, key, claim.record.token, print_, request)
                await self._send_outcome(send, outcome, _NOT_REPLAYED)
                return
            record = claim.record
            if claim.status is ClaimStatus.MISMATCH:
                raise FingerprintMismatch(
                    f"Idempotency-Key {key!r} was first used with a different request"
                )
            if claim.status is ClaimStatus.COMPLETED:
                assert record.response is not None
                await _send_stored(send, record.response, _REPLAYED)
                return
            # In progress in another process: wait for it, then claim again
            # (a release or a lapsed lease lets this request run it).
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                lease_left = record.lease_expires_at - self.clock.now()
                raise RequestInProgress(
                    f"a request with Idempotency-Key {key!r} is still running; retry later",
                    retry_after=max(1.0, min(lease_left, 30.0)),
                )
            await self.store.wait(tenant, key, remaining)

    async def _await_local(self, execution: Execution, deadline: float) -> Outcome:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(asyncio.shield(execution.future), max(0.0, remaining))
        except TimeoutError:
            raise RequestInProgress(
                f"a request with Idempotency-Key {execution.key!r} is still running; retry later",
                retry_after=max(1.0, math.ceil(self.settings.lease / 3)),
            ) from None

    async def _execute(
        self, tenant: str, key: str, token: str, print_: str, request: ProxiedRequest
    ) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        execution = Execution(tenant, key, token, print_, future)
        self.running[(tenant, key)] = execution
        task = asyncio.create_task(
            run_execution(
                self.store,
                self.upstream,
                execution,
                request,
                lease=self.settings.lease,
                ttl=self.settings.ttl,
                running=self.running,
            )
        )
        # Keep a reference: the task must outlive this request if the client leaves.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(future)

    @staticmethod
    async def _send_outcome(send: Send, outcome: Outcome, marker: tuple[bytes, bytes]) -> None:
        if isinstance(outcome, ProblemError):
            raise outcome
        await _send_stored(send, outcome, marker)

    async def drain(self, grace: float) -> None:
        """At shutdown: let keyed runs finish for up to ``grace`` seconds, then cancel them."""
        if not self._tasks:
            return
        log.info("waiting up to %.0fs for %d keyed upstream call(s)", grace, len(self._tasks))
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def purge_loop(self, every: float) -> None:
        """Delete expired records now and then, so the store does not grow without bound."""
        while True:
            await asyncio.sleep(every)
            try:
                purged = await self.store.purge_expired()
            except ProblemError as exc:
                log.warning("purging expired records failed: %s", exc)
                continue
            if purged:
                log.debug("purged %d expired records", purged)
