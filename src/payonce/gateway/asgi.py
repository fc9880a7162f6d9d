"""Small ASGI helpers: reading a bounded body, sending a whole response, problem+json."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from payonce.errors import BodyTooLarge, ProblemError

__all__ = [
    "Receive",
    "Scope",
    "Send",
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
    headers = [(b"content-type", b"application/problem+json")]
    if error.should_retry is not None:
        headers.append((b"x-should-retry", b"true" if error.should_retry else b"false"))
    if error.retry_after is not None:
        seconds = max(1, math.ceil(error.retry_after))
        headers.append((b"retry-after", str(seconds).encode()))
    return headers, json.dumps(problem, separators=(",", ":")).encode()


async def problem_response(send: Send, error: ProblemError, instance: str | None = None) -> None:
    """Answer with an RFC 9457 problem document and the headers SDKs act on."""
    headers, body = problem_document(error, instance)
    await send_response(send, error.status, headers, body)
