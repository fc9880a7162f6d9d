"""``protect()``: an official OpenAI or Anthropic SDK client, retried by payonce.

The SDKs retry on their own (``max_retries=2``: three attempts) and never send
the idempotency key they mint. ``protect()`` returns a copy of the client whose
own retries are off (``max_retries=0``) and whose HTTP client sends through an
:class:`IdempotentTransport` (or its async twin), so each SDK call is one
logical call: one key, the payonce policy, gateway checks after ambiguous
failures. The original client is left as it was.

Duck-typed: it needs the SDK's ``with_options(max_retries=, http_client=,
timeout=)`` and its HTTP client in ``_client``, as both official SDKs have:
an httpx2 client (openai 3.x, anthropic 2.x) or an httpx one (openai 1.x and
2.x, anthropic 1.x: :mod:`payonce.client._httpx`). payonce imports neither SDK
(the private parts: :mod:`payonce.client._sdk`).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import httpx2

from payonce.client import _sdk
from payonce.client._async_transport import AsyncIdempotentTransport
from payonce.client._budget import RetryBudget
from payonce.client._clock import RetryClock
from payonce.client._hooks import RetryHook
from payonce.client._policy import RetryPolicy
from payonce.client._transport import IdempotentTransport

__all__ = ["protect"]

SDKClient = TypeVar("SDKClient")

# The SDKs' own pool limits (openai._constants.DEFAULT_CONNECTION_LIMITS).
_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)


def protect(
    client: SDKClient,
    *,
    policy: RetryPolicy | None = None,
    gateway: bool | str | None = None,
    hooks: Iterable[RetryHook] | None = None,
    budget: RetryBudget | None = None,
    clock: RetryClock | None = None,
    key_factory: Callable[[], str] | None = None,
    tenant_header: str | None = None,
    transport: object | None = None,
    rng: random.Random | None = None,
) -> SDKClient:
    """A copy of an ``openai``/``anthropic`` client (sync or async) retried by payonce.

    ::

        client = protect(openai.OpenAI(base_url="http://127.0.0.1:8080/v1"))

    The keyword arguments are those of :class:`IdempotentTransport`;
    ``transport`` is the transport that really sends, of the SDK's HTTP library
    (httpx2 for openai 3.x and anthropic 2.x, httpx for openai 1.x/2.x and
    anthropic 1.x; default: a new ``HTTPTransport`` or ``AsyncHTTPTransport``
    with the SDKs' pool limits).

    Timeouts: a timeout set on the client (``openai.OpenAI(timeout=0.5)``,
    anything but the SDK's default) is kept: it becomes the policy's
    ``read_timeout`` (and ``connect_timeout`` when it sets one), replacing the
    policy's own. With the SDK's default timeout, the policy's apply. A
    ``timeout=`` passed to one call still applies when it is shorter.

    A key passed as ``extra_headers={"Idempotency-Key": ...}`` is used for
    that call instead of a new UUID.

    Protect a client once and reuse it: each protected copy has its own
    connection pool and its own retry budget (pass ``budget=`` to share one).
    """
    policy = policy or RetryPolicy()
    sdk = cast(Any, client)
    own = _timeout_set_on(sdk)
    if own is not None:
        policy = dataclasses.replace(
            policy,
            read_timeout=own.read if own.read is not None else policy.read_timeout,
            connect_timeout=own.connect if own.connect is not None else policy.connect_timeout,
        )
    current = _sdk.http_client(sdk)
    options: dict[str, Any] = {
        "policy": policy,
        "gateway": gateway,
        "hooks": hooks,
        "budget": budget,
        "clock": clock,
        "key_factory": key_factory,
        "tenant_header": tenant_header,
        "rng": rng,
    }
    timeout: Any = httpx2.Timeout(policy.read_timeout, connect=policy.connect_timeout)
    http_client: Any
    if isinstance(current, httpx2.AsyncClient):
        inner = transport or httpx2.AsyncHTTPTransport(limits=_LIMITS)
        if not isinstance(inner, httpx2.AsyncBaseTransport):
            raise TypeError("an async client needs an httpx2.AsyncBaseTransport")
        http_client = httpx2.AsyncClient(
            transport=AsyncIdempotentTransport(inner, **options),
            timeout=timeout,
            follow_redirects=True,
        )
    elif isinstance(current, httpx2.Client):
        inner_sync = transport or httpx2.HTTPTransport(limits=_LIMITS)
        if not isinstance(inner_sync, httpx2.BaseTransport):
            raise TypeError("a sync client needs an httpx2.BaseTransport")
        http_client = httpx2.Client(
            transport=IdempotentTransport(inner_sync, **options),
            timeout=timeout,
            follow_redirects=True,
        )
    elif _built_on(current, "httpx"):
        # openai 1.x/2.x, anthropic 1.x: the same transports, bridged (client/_httpx.py).
        from payonce.client._httpx import http_client_for

        http_client, timeout = http_client_for(current, transport, policy, options)
    else:
        raise TypeError(
            f"protect() expects an openai or anthropic client built on httpx2 or httpx, "
            f"got {type(client).__name__}"
        )
    protected = sdk.with_options(max_retries=0, http_client=http_client, timeout=timeout)
    # The SDK's own per-call key, if it was switched on, is kept (our transport reuses it).
    _sdk.set_idempotency_header(protected, _sdk.idempotency_header(sdk))
    return cast(SDKClient, protected)


def _timeout_set_on(sdk: Any) -> httpx2.Timeout | None:
    """The timeout the application set on an SDK client, or ``None`` for the SDK's default.

    Both SDKs keep it in ``client.timeout`` (a number, or an httpx2 or httpx
    ``Timeout``) and export their default as ``DEFAULT_TIMEOUT`` at the
    package's top level.
    """
    value = getattr(sdk, "timeout", None)
    timeout = _as_httpx2(value)
    if timeout is None:
        return None  # NOT_GIVEN, None (no timeout at all): the policy's apply
    package = sys.modules.get(type(sdk).__module__.split(".")[0])
    if timeout == _as_httpx2(getattr(package, "DEFAULT_TIMEOUT", None)):
        return None
    return timeout


def _as_httpx2(value: object) -> httpx2.Timeout | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return httpx2.Timeout(float(value))
    if isinstance(value, httpx2.Timeout):
        return value
    if _built_on(value, "httpx") and type(value).__name__ == "Timeout":
        parts = {name: getattr(value, name) for name in ("connect", "read", "write", "pool")}
        return httpx2.Timeout(**parts)
    return None


def _built_on(value: object, package: str) -> bool:
    """``value``'s class or one of its bases comes from ``package`` (the SDKs subclass
    httpx's client: ``SyncHttpxClientWrapper``)."""
    return any(cls.__module__.split(".")[0] == package for cls in type(value).__mro__)
