"""Any upstream event stream, relayed on a keyed path, reads as the upstream's own events.

The gateway frames what it relays (an ``id:`` on each event, comments sent
bare, stray blank lines dropped); whatever bytes the upstream sent, cut however,
a client must dispatch the same events, with the same data and type, on the
first call and on the replay from the store. Checked with a decoder that follows
WHATWG HTML 9.2.6 (tests/support/sse.py) and with the openai SDK's own, which
dispatches an empty event at any blank line once an id was seen (issue 29,
defect 5: comments crashed it with ``json.loads("")``).

One documented difference: a stream that ends without its last blank line has
its last event completed and relayed (docs/gateway.md, "Odd input"), where the
standard would drop it; the expected events are read with that blank line added.

Real processes: a gateway (SQLite) in front of a raw-socket upstream of this
test's, which answers each request with the stream and chunk cuts its body names.
"""

from __future__ import annotations

import base64
import itertools
import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from tests.fuzz.conftest import LIVE
from tests.support.processes import Process, start_payonce
from tests.support.sse import Event, decode, read_stream

AUTH = {"Authorization": "Bearer sk-fuzz-sse"}
PATH = "/v1/fuzz/events"  # not a chat path: the gateway asks for no usage chunk here
_keys = itertools.count()

streams = st.lists(
    st.sampled_from(
        [
            b"\r",
            b"\n",
            b"\r\n",
            b"\n\n",
            b"data: x",
            b"data",
            b"data:",
            b"data:  y",
            b"data: [DONE]",
            b"event: e",
            b"event:",
            b"id: 9",
            b"id",
            b":",
            b": ping",
            b": OPENROUTER PROCESSING",
            b"retry: 5",
            b"z",
        ]
    ),
    max_size=40,
).map(b"".join)


class _Upstream(socketserver.BaseRequestHandler):
    """Answers one request with ``{"sse": base64, "cuts": [...]}`` from its body, chunked."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += sock.recv(65536)
        asked = json.loads(body)
        stream = base64.b64decode(asked["sse"])
        answer = bytearray(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        position = 0
        for cut in [*asked["cuts"], len(stream)]:
            piece = stream[position : position + cut]
            position += len(piece)
            if piece:
                answer += b"%x\r\n%s\r\n" % (len(piece), piece)
        answer += b"0\r\n\r\n"
        sock.sendall(answer)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def relay(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp: Path = tmp_path_factory.mktemp("sse-relay")
    process = start_payonce(
        ["serve", "--upstream", upstream, "--store", f"sqlite:///{tmp}/payonce.db", "--no-otel"],
        log_dir=tmp,
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()
        assert "Traceback" not in process.output(), process.output()[-3000:]


def _sdk_events(body: bytes) -> list[Event]:
    """What the openai SDK's decoder dispatches, as the standard's events."""
    return [
        Event(sse.event or "message", sse.data, sse.id or "")
        for sse in SSEDecoder().iter_bytes(iter([body]))
    ]


@LIVE
@given(streams, st.lists(st.integers(min_value=0, max_value=12), max_size=8))
@example(b"data: a\n\n: ping\n\ndata: b\n\n", [])  # a keep-alive between two events
@example(b": ping\n\n\n\ndata: a\n\n: ping\n\n", [3])  # before, after, stray blank lines
@example(b"event: e\n\ndata: a\n\n", [])  # an event type without data: nothing
@example(b"data: a\r\n\r\n:\r\rdata: b\r", [1, 1])
def test_a_relayed_stream_reads_as_the_upstreams_events_first_and_on_replay(
    relay: Process, stream: bytes, cuts: list[int]
) -> None:
    expected = decode(stream + b"\n\n")
    key = f"sse-fuzz-{next(_keys)}"
    body = {"sse": base64.b64encode(stream).decode(), "cuts": cuts}
    headers = {**AUTH, "Idempotency-Key": key}
    first = read_stream(relay.url + PATH, body, headers)
    assert (first.status, first.broken) == (200, False), first.body[:300]
    status = httpx.get(f"{relay.url}/_payonce/requests/{key}?wait=30", headers=AUTH, timeout=40)
    assert status.json()["state"] == "completed"
    replay = read_stream(relay.url + PATH, body, headers)
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.body == first.body
    assert decode(first.body) == expected
    assert _sdk_events(first.body) == expected
