"""Small ASGI helpers: reading a bounded body, sending a whole response, problem+json."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from contextvars import ContextVar
from typing import Any

from payonce.errors import BodyTooLarge, ProblemError

__all__ = [
    "BROKEN_ON_PURPOSE",
    "WRITE_BODY",
    "BodyWriter",
    "Receive",
    "Scope",
    "Send",
    "body_writer",
    "break_response",
    "broken_reason",
    "client_left",
    "problem_document",
    "problem_response",
    "read_body",
    "send_json",
    "send_response",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Writes one chunk of a started response's body now, without a task switch or an
# ASGI message; False when it cannot without waiting (the client reads slowly,
# has left, or the response is not a chunked body in progress): then the caller
# sends it with ``send``, which waits as ASGI does.
BodyWriter = Callable[[bytes], bool]

# The scope extension under which the gateway's own HTTP protocol offers a
# BodyWriter (:mod:`payonce.gateway.transport`). Under another server it is
# absent and every chunk goes through ``send``.
WRITE_BODY = "payonce.write_body"


def body_writer(scope: Scope) -> BodyWriter | None:
    """The server's :data:`BodyWriter` for this request, if it offers one."""
    extensions = scope.get("extensions")
    return extensions.get(WRITE_BODY) if extensions else None


# Why the current request's response was left unfinished on purpose, if it was.
# A context variable because the request's task is the one uvicorn logs from
# after the app returns: setting it in the app is visible there.
_broken: ContextVar[str | None] = ContextVar("payonce_broken_response", default=None)

# What uvicorn logs when an app returns after starting a response it did not end.
BROKEN_ON_PURPOSE = "ASGI callable returned without completing response"


def break_response(reason: str) -> None:
    """Leave the current response without its last chunk: the client sees a broken body.

    ASGI has no abort message. An app that returns without the final body
    message makes the server close the connection mid-body, which is how a
    client learns that a stream broke off rather than ended (a clean end would
    hand it a short answer as if it were whole). The reason is logged once, by
    the gateway; the server's own generic complaint is filtered out.
    """
    _broken.set(reason)


def broken_reason() -> str | None:
    """The reason given to :func:`break_response` in this request, if any."""
    return _broken.get()


def client_left(receive: Receive) -> bool:
    """Whether the client disconnected before its response was complete.

    uvicorn (the only server the gateway runs under, gateway/server.py) keeps
    that fact on the request cycle its ``receive`` belongs to: ``disconnected``
    is set when the connection is lost before the response is complete, and
    sends after it are dropped silently. Reading the flag costs nothing, where
    a task watching ``receive()`` on every request would cost several
    microseconds. Under another server this answers False (the call log then
    reports what was sent, as before); the call-log tests pin the behaviour.
    """
    cycle = getattr(receive, "__self__", None)
    return getattr(cycle, "disconnected", False) is True


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


async def read_body(receive: Receive, headers: Iterable[tuple[bytes, bytes]], limit: int) -> bytes:
    """Read the whole request body, refusing more than ``limit`` bytes with 413."""
    for name, value in headers:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = -1
            if declared > limit:
                raise BodyTooLarge(f"request body of {declared} bytes exceeds --max-body {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body exceeds --max-body {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_response(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, payload: object, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json")]
    if extra:
        headers.extend(extra)
    await send_response(send, status, headers, body)


def problem_document(
    error: ProblemError, instance: str | None = None
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """An RFC 9457 problem document and the headers SDKs act on (without content-length)."""
    problem: dict[str, object] = {
        "type": error.type_uri,
        "title": error.title,
        "status": error.status,
        "detail": error.detail,
    }
    if instance:
        problem["instance"] = instance
    # An extension member (RFC 9457 section 3.2): the openai SDKs print only a
    # "message" (top level or in "error"), so without it their users see just
    # "Error code: 400" and never learn why.
    problem["message"] = error.detail
    # The SDKs' own error member: openai-python and openai-node read
    # error.message (without it the Node SDK says "422 status code (no body)"),
    # anthropic's SDKs error.type and error.message.
    problem["error"] = {"message": error.detail, "type": error.slug, "code": error.slug}
    headers = [(b"content-type", b"application/problem+json")]
    if error.should_retry is not None:
        headers.append((b"x-should-retry", b"true" if error.should_retry else b"false"))
    if error.retry_after is not None:
        seconds = max(1, math.ceil(error.retry_after))
        headers.append((b"retry-after", str(seconds).encode()))
    headers.extend(error.headers)
    return headers, json.dumps(problem, separators=(",", ":")).encode()


async def problem_response(send: Send, error: ProblemError, instance: str | None = None) -> None:
    """Answer with an RFC 9457 problem document and the headers SDKs act on."""
    headers, body = problem_document(error, instance)
    await send_response(send, error.status, headers, body)
