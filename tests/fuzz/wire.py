"""Raw HTTP/1.1 on a socket: what the fuzz tests send when a client library would refuse to."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket

from tests.support.processes import Process

BODY = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
_keys = itertools.count()


def exchange(
    gateway: Process, head: bytes, body: bytes = BODY
) -> tuple[int, dict[bytes, bytes], bytes]:
    """Send one request on a new connection; the status, headers and body of the answer."""
    port = int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # Refused before all was sent: its answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(
                head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
            )
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received, "no answer at all"
    head_bytes, _, rest = received.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, rest


def answered_well(status: int, headers: dict[bytes, bytes], body: bytes) -> None:
    assert status < 500, body[:300]
    if b"idempotent-replayed" in headers:
        # The upstream's own answer, relayed: the simulator (aiohttp) refuses a
        # repeated Content-Type or a field over 8,190 bytes with a plain-text 400.
        return
    if status >= 400:
        assert headers[b"content-type"] == b"application/problem+json", (status, body[:200])
        assert json.loads(body)["status"] == status


def request(fields: list[tuple[bytes, bytes]], *, keyed: bool = False) -> bytes:
    """A chat request with ``fields``; ``keyed``: a fresh key first, so what the upstream
    answered is told from the gateway's answers by its Idempotent-Replayed header."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
    )
    if keyed:
        head += b"Idempotency-Key: fuzz-%d-%d\r\n" % (id(_keys), next(_keys))
    return head + b"".join(name + b": " + value + b"\r\n" for name, value in fields)
