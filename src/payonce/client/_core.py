"""What the sync and the async transport share: configuration, keys and bookkeeping."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence

import httpx2

from payonce.client._budget import RetryBudget
from payonce.client._call import Call
from payonce.client._clock import RetryClock, SystemRetryClock
from payonce.client._gateway import GatewayDirectory
from payonce.client._hooks import RetryHook, default_hooks
from payonce.client._policy import RetryPolicy
from payonce.client._scenario import SCENARIO_HEADER, current_scenario

__all__ = ["KEY_HEADER", "TransportCore", "decoded_body", "is_event_stream"]

KEY_HEADER = "Idempotency-Key"
_KEY_HEADERS = ("idempotency-key", "x-idempotency-key")
# RFC 9110, 9.2.1: repeating a safe request is harmless, so it needs no key.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def _new_key() -> str:
    return str(uuid.uuid4())


def _bare_key(value: str) -> str:
    # The gateway accepts an RFC 8941 quoted string; its status endpoint takes the bare key.
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def is_event_stream(response: httpx2.Response) -> bool:
    """An SSE answer is relayed as it streams, never buffered."""
    return response.headers.get("content-type", "").startswith("text/event-stream")


def decoded_body(response: httpx2.Response, raw: bytes) -> bytes:
    """The body of an error response with its content coding undone, for classification."""
    if "content-encoding" not in response.headers:
        return raw
    try:
        return httpx2.Response(response.status_code, headers=response.headers, content=raw).read()
    except httpx2.DecodingError:
        return b""


class TransportCore:
    """Configuration shared by :class:`IdempotentTransport` and its async twin."""

    def __init__(
        self,
        *,
        policy: RetryPolicy | None,
        gateway: bool | str | None,
        hooks: Iterable[RetryHook] | None,
        budget: RetryBudget | None,
        clock: RetryClock | None,
        key_factory: Callable[[], str] | None,
        tenant_header: str | None,
        rng: random.Random | None,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.gateways = GatewayDirectory(gateway)
        self.hooks: Sequence[RetryHook] = default_hooks() if hooks is None else tuple(hooks)
        if budget is None and self.policy.budget_tokens is not None:
            budget = RetryBudget(self.policy.budget_tokens, self.policy.budget_ratio)
        self.budget = budget
        self.clock: RetryClock = clock or SystemRetryClock()
        self.key_factory = key_factory or _new_key
        self.status_headers: tuple[str, ...] = (tenant_header,) if tenant_header else ()
        self.rng = rng

    def begin(self, request: httpx2.Request) -> Call:
        """Give the request its key (the caller's, or a new one) and start its call."""
        key: str | None = None
        for name in _KEY_HEADERS:
            if name in request.headers:
                key = _bare_key(request.headers[name])
                break
        if key is None and request.method.upper() not in _SAFE_METHODS:
            key = self.key_factory()
            request.headers[KEY_HEADER] = key
        named = current_scenario()
        if named is not None and SCENARIO_HEADER not in request.headers:
            request.headers[SCENARIO_HEADER] = named
        return Call(
            policy=self.policy,
            budget=self.budget,
            clock=self.clock,
            hooks=self.hooks,
            rng=self.rng,
            method=request.method,
            url=str(request.url.copy_with(query=None)),
            key=key,
            gateway=self.gateways.check_base(request.url) is not None,
            wall_now=time.time(),
        )

    def rebuild(self, response: httpx2.Response, raw: bytes) -> httpx2.Response:
        """The same answer with its (still encoded) body buffered in memory."""
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=httpx2.ByteStream(raw),
            extensions=dict(response.extensions),
        )
