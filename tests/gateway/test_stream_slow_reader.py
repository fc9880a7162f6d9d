"""A client that stops reading mid-stream, from a raw socket: its events wait, none lost.

Events of a stream a client keeps up with go straight to its socket, written by
whoever has them (the run, for a keyed stream) without a message per event
(gateway/asgi.py, BodyWriter). Here the client reads nothing for a while, then
everything: every event must arrive once, in order, numbered as a replay
numbers it, and the chunked body must end properly. (On loopback the kernel
takes megabytes before the gateway has to stop writing, so the hand-over to the
follower's own task when a push is refused is tested in tests/gateway/test_live.py.)
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlsplit

import pytest

from tests.gateway.conftest import AUTH, Sim
from tests.gateway.test_streaming import raw_events
from tests.support.processes import Process

TOKENS = 1024  # the simulator's longest answer
CHOICES = 2
BODY = {
    "model": "gpt-4o-mini",
    # The simulator answers a prompt's length in tokens (capped by max_tokens).
    "messages": [{"role": "user", "content": "tok " * TOKENS}],
    "max_tokens": TOKENS,
    "n": CHOICES,
    "stream": True,
}


def _dechunked(raw: bytes) -> bytes:
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower()
    body = bytearray()
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", "the body ends with its last chunk"
            return bytes(body)
        body += rest[:size]
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


def _read_late(gateway: Process, key: str | None, pause: float) -> bytes:
    """The whole response to a stream request whose client reads nothing for ``pause`` s."""
    url = urlsplit(gateway.url)
    payload = json.dumps(BODY).encode()
    headers = {**AUTH, "Content-Type": "application/json", "X-Sim-Token-Ms": "2"}
    if key is not None:
        headers["Idempotency-Key"] = key
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head += f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    with socket.socket() as client:
        # A small window: the gateway's writes back up into its own buffers at once.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect((url.hostname, url.port))
        client.sendall(head.encode() + payload)
        time.sleep(pause)
        client.settimeout(30)
        received = bytearray()
        while chunk := client.recv(65536):
            received += chunk
    return _dechunked(bytes(received))


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_a_client_that_stops_reading_gets_every_event_once(
    gateway: Process, fresh_sim: Sim, keyed: bool
) -> None:
    key = f"slow-{uuid.uuid4().hex[:8]}" if keyed else None
    body = _read_late(gateway, key, pause=1.5)
    events = [event + b"\n\n" for event in body.split(b"\n\n") if event]
    data = [event for event in events if event.startswith(b"data:")]
    assert len(data) == (TOKENS + 2) * CHOICES + 1, "every token, role and finish, [DONE]"
    assert data[-1].startswith(b"data: [DONE]")
    if keyed:
        # Numbered 1, 2, ... in order, and the same bytes a replay gives.
        numbers = [int(event.rsplit(b"id: ", 1)[1].split(b"-")[0]) for event in events]
        assert numbers == list(range(1, len(events) + 1))
        assert raw_events(gateway.url, key, {"X-Sim-Token-Ms": "0"}, BODY) == events
    assert fresh_sim.billed() == 1
