"""One very large SSE event (a 30 MB base64 image in a single chunk), end to end.

The event splitter joined every new chunk onto the part of the event it had and
searched the whole of it again: quadratic in the event's size. A 30 MB event in
the upstream's 64 KiB writes took 6.8 s through the gateway (0.23 s direct), the
event loop stalled up to 0.6 s at a time, and in 4 KiB chunks an 8 MB event took
about a minute of CPU. Now each chunk is searched once.

A real gateway in front of a real HTTP server (threads in this process, on a
free port) that sends one 30 MB event in 64 KiB writes.
"""

from __future__ import annotations

import http.server
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from payonce.gateway.sse import EventSplitter
from tests.support.processes import Process, start_payonce

SIZE = 30_000_000
_CHUNK = {"id": "chatcmpl-large", "object": "chat.completion.chunk", "model": "gpt-4o-mini"}
EVENTS = [
    b"data: "
    + orjson.dumps({**_CHUNK, "choices": [{"index": 0, "delta": {"content": "x" * SIZE}}]})
    + b"\n\n",
    b"data: "
    + orjson.dumps({**_CHUNK, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}})
    + b"\n\n",
    b"data: [DONE]\n\n",
]
BODY = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "draw"}]}
AUTH = {"Authorization": "Bearer sk-large-event"}


class _Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    calls = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).calls += 1
        body = b"".join(EVENTS)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("x-request-id", f"req-large-{self.calls}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for start in range(0, len(body), 65536):
            self.wfile.write(body[start : start + 65536])

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


@pytest.fixture
def upstream() -> Iterator[str]:
    server = _Server(("127.0.0.1", 0), _Upstream)
    _Upstream.calls = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def gateway(upstream: str, tmp_path: Path) -> Iterator[Process]:
    args = ["serve", "--upstream", upstream, "--store", f"sqlite:///{tmp_path}/p.db", "--no-otel"]
    process = start_payonce(args, log_dir=tmp_path, ready_path="/_payonce/health")
    yield process
    process.stop()


def _data(stream: bytes) -> list[bytes]:
    return [line for line in stream.split(b"\n") if line.startswith(b"data:")]


def test_a_30_mb_event_is_relayed_whole_and_replayed_once_stored(gateway: Process) -> None:
    headers = {**AUTH, "Idempotency-Key": f"large-event-{uuid.uuid4()}"}
    answers = []
    for _ in range(2):
        response = httpx.post(
            gateway.url + "/v1/chat/completions", json=BODY, headers=headers, timeout=120
        )
        assert response.status_code == 200, response.text[:500]
        answers.append(response)
    first, again = answers
    # The usage chunk goes: the gateway asked for it on the client's behalf.
    expected = [event.rstrip(b"\n") for event in EVENTS[:1] + EVENTS[2:]]
    assert _data(first.content) == expected
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert _Upstream.calls == 1


def test_splitting_an_event_costs_its_size_not_its_size_squared() -> None:
    # 8 MB in 4 KiB pieces: joined and searched again each time, about 8 GB of
    # copying and scanning (a minute or more); searched once, well under a second.
    event = b"data: " + b"y" * 8_000_000 + b"\n\n"
    splitter, out = EventSplitter(), []
    started = time.monotonic()
    for start in range(0, len(event), 4096):
        out += splitter.feed(event[start : start + 4096])
    assert out == [event] and splitter.close() == []
    assert time.monotonic() - started < 20, "a multi-second stall, not a measurement"
