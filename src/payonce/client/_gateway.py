"""Talking to a payonce gateway: recognising one, and asking it about a key.

A gateway is recognised from any of its answers (docs/gateway.md, "What the gateway
does"): keyed answers carry ``Idempotent-Replayed``, pass-through answers
``Via: 1.1 payonce``, and its own errors are ``application/problem+json`` whose
``type`` URI names payonce. The transport remembers each origin it has seen
answer that way; ``gateway=True`` or a base URL skips the guessing, which
matters for the very first call.

After an ambiguous failure the transport asks, with the call's credential
headers (records are scoped by credential)::

    GET {base}/_payonce/requests/{key}?wait=S   200 completed ─► GET …/{key}/response
                                                200 in_progress ─► pause, ask again while time left
                                                200 abandoned ─► its gateway died: re-send
                                                404 ─► nothing ran or it was released: re-send

``abandoned`` (the record's lease lapsed) and ``404 abandoned`` from
``/response`` mean what 404 means: nobody runs the key, a re-send with it runs
it once. Any other state, from a newer gateway, is "learnt nothing".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from urllib.parse import quote

import httpx2

from payonce.client._call import Lookup
from payonce.credentials import (
    CREDENTIAL_HEADERS,
)  # the gateway's list (docs/gateway.md, "Tenants")

__all__ = [
    "CREDENTIAL_HEADERS",
    "GatewayDirectory",
    "looks_like_gateway",
    "read_status",
    "read_stored",
    "response_request",
    "status_request",
]


def _problem_type(headers: httpx2.Headers, body: bytes) -> str | None:
    if not headers.get("content-type", "").startswith("application/problem+json"):
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    kind = document.get("type") if isinstance(document, dict) else None
    return kind if isinstance(kind, str) else None


def looks_like_gateway(headers: httpx2.Headers, body: bytes = b"") -> bool:
    """Whether an answer came from a payonce gateway (``body`` only matters for errors)."""
    if "idempotent-replayed" in headers:
        return True
    if any("payonce" in via.lower() for via in headers.get_list("via")):
        return True
    kind = _problem_type(headers, body)
    return kind is not None and "payonce" in kind


def origin_of(url: httpx2.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


class GatewayDirectory:
    """Which origins are payonce gateways: configured, or learnt from their answers."""

    def __init__(self, gateway: bool | str | None) -> None:
        self.configured = gateway
        self._known: set[str] = set()
        # Origins whose status endpoint was asked once and did not answer as a
        # gateway: not asked again, until one of their answers says otherwise.
        self._not_gateways: set[str] = set()
        self._lock = threading.Lock()

    def observe(self, url: httpx2.URL, headers: httpx2.Headers, body: bytes) -> None:
        if self.configured is None and looks_like_gateway(headers, body):
            origin = origin_of(url)
            with self._lock:
                self._known.add(origin)
                self._not_gateways.discard(origin)

    def not_a_gateway(self, url: httpx2.URL) -> None:
        """The status endpoint of ``url``'s origin did not answer as a payonce gateway."""
        if self.configured is None:
            origin = origin_of(url)
            with self._lock:
                if origin not in self._known:
                    self._not_gateways.add(origin)

    def check_base(self, url: httpx2.URL) -> str | None:
        """Where to ask about a key after an ambiguous failure of a request to ``url``.

        A gateway not seen yet is asked too (``gateway=None``): the very first
        call must not lose an answer that was already paid for. A server that is
        no payonce gateway answers that question with a 404 of its own, which
        the transport reads as ``Lookup.NO_GATEWAY``.
        """
        if self.configured is None:
            origin = origin_of(url)
            return None if origin in self._not_gateways else origin
        return self.base_for(url)

    def base_for(self, url: httpx2.URL) -> str | None:
        """The base URL of the gateway serving ``url``, or ``None`` if it is not one."""
        if isinstance(self.configured, str):
            return self.configured.rstrip("/")
        if self.configured is False:
            return None
        origin = origin_of(url)
        if self.configured is True or origin in self._known:
            return origin
        return None


def _status_headers(source: httpx2.Headers, extra: Iterable[str]) -> list[tuple[str, str]]:
    names = {*CREDENTIAL_HEADERS, *(name.lower() for name in extra)}
    return [(name, value) for name, value in source.multi_items() if name.lower() in names]


def status_request(
    base: str,
    key: str,
    wait: float,
    source: httpx2.Headers,
    extra_headers: Iterable[str],
    timeouts: dict[str, float],
) -> httpx2.Request:
    """``GET {base}/_payonce/requests/{key}?wait=S`` with the call's credential."""
    return _record_request(base, key, f"?wait={wait:.3f}", source, extra_headers, timeouts)


def response_request(
    base: str,
    key: str,
    source: httpx2.Headers,
    extra_headers: Iterable[str],
    timeouts: dict[str, float],
) -> httpx2.Request:
    """``GET {base}/_payonce/requests/{key}/response`` with the call's credential."""
    return _record_request(base, key, "/response", source, extra_headers, timeouts)


def _record_request(
    base: str,
    key: str,
    suffix: str,
    source: httpx2.Headers,
    extra_headers: Iterable[str],
    timeouts: dict[str, float],
) -> httpx2.Request:
    url = f"{base}/_payonce/requests/{quote(key, safe='')}{suffix}"
    return httpx2.Request(
        "GET",
        url,
        headers=_status_headers(source, extra_headers),
        extensions={"timeout": timeouts},
    )


def read_status(status: int, headers: httpx2.Headers, body: bytes) -> Lookup:
    """What ``GET /_payonce/requests/{key}`` answered."""
    if status == 404 and "not-found" in (_problem_type(headers, body) or ""):
        return Lookup.NOT_FOUND
    if status != 200:
        return Lookup.UNKNOWN  # 401 from a proxy, 5xx, an old gateway: we learnt nothing
    try:
        document = json.loads(body)
    except ValueError:
        return Lookup.UNKNOWN
    state = document.get("state") if isinstance(document, dict) else None
    if state == "completed":
        return Lookup.COMPLETED
    if state == "in_progress":
        return Lookup.IN_PROGRESS
    if state == "abandoned":
        return Lookup.NOT_FOUND
    return Lookup.UNKNOWN


def read_stored(status: int, headers: httpx2.Headers, body: bytes) -> Lookup:
    """What ``GET /_payonce/requests/{key}/response`` answered.

    The stored response comes back with its own status (which may itself be an
    error, say a stored 400) and ``Idempotent-Replayed: true``; the gateway's own
    errors are problem documents without that header.
    """
    if headers.get("idempotent-replayed", "").lower() == "true":
        return Lookup.COMPLETED
    kind = _problem_type(headers, body) or ""
    if status == 404 and ("not-found" in kind or kind.endswith("#abandoned")):
        return Lookup.NOT_FOUND
    if status == 409 and "in-progress" in kind:
        return Lookup.IN_PROGRESS
    return Lookup.UNKNOWN
