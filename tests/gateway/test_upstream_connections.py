"""The gateway's upstream connections (gateway/upstream_http.py), seen from both ends.

A raw-socket upstream writes the responses byte for byte (a body with a
length, chunked, delimited by the connection's end, after a 100 Continue, to a
HEAD) and counts the connections it accepts; a real gateway is in front and a
urllib client behind. One gateway and one upstream for the module.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.processes import Process, free_port, start_payonce
from tests.support.waiting import wait_until

BODY = b'{"id":"chatcmpl-raw","object":"chat.completion","choices":[]}'
AUTH = {"Authorization": "Bearer sk-raw", "Content-Type": "application/json"}


def _answer(path: str, method: str) -> tuple[bytes, bool]:
    """The response bytes for ``path``, and whether to close the connection after them."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: raw-1\r\n"
    if path.endswith("/chunked"):
        half = len(BODY) // 2
        chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            half,
            BODY[:half],
            len(BODY) - half,
            BODY[half:],
        )
        return head + b"transfer-encoding: chunked\r\n\r\n" + chunks, False
    if path.endswith("/until-close"):
        return head + b"\r\n" + BODY, True
    if path.endswith("/continue"):
        return b"HTTP/1.1 100 Continue\r\n\r\n" + head + b"content-length: %d\r\n\r\n%s" % (
            len(BODY),
            BODY,
        ), False
    if path.endswith("/then-close"):  # keep-alive by its headers, then the server hangs up
        return head + b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY), True
    length = b"content-length: %d\r\n\r\n" % len(BODY)
    return head + length + (b"" if method == "HEAD" else BODY), False


class RawUpstream:
    """HTTP/1.1 written by hand, one thread per connection; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = 0  # connections this side has closed
        self.heads: list[bytes] = []  # every request head received, as sent
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._exchange(conn)
        finally:
            conn.close()
            self.closed += 1

    def _exchange(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                data = conn.recv(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            self.heads.append(head)
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            while len(buffer) < length:
                buffer += conn.recv(65536)
            buffer = buffer[length:]
            response, close = _answer(path, method)
            conn.sendall(response)
            if close:
                return

    def close(self) -> None:
        self._server.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[RawUpstream]:
    server = RawUpstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def gateway(upstream: RawUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp: Path = tmp_path_factory.mktemp("raw-upstream")
    args = ["serve", "--upstream", upstream.url, "--store", f"sqlite:///{tmp}/payonce.db"]
    process = start_payonce(args, log_dir=tmp, ready_path="/_payonce/health", port=free_port())
    yield process
    process.stop()


def _post(
    gateway: Process, path: str, key: str | None = None, method: str = "POST"
) -> tuple[int, bytes, dict[str, str]]:
    headers = dict(AUTH)
    if key is not None:
        headers["Idempotency-Key"] = key
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(gateway.url + path, data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read(), dict(response.headers)


def test_connections_are_kept_alive(gateway: Process, upstream: RawUpstream) -> None:
    _post(gateway, "/v1/chat/completions")  # the pool now holds one connection
    before = upstream.connections
    for n in range(5):
        status, body, _ = _post(
            gateway, "/v1/chat/completions", key=f"alive-{n}" if n % 2 else None
        )
        assert (status, body) == (200, BODY)
    assert upstream.connections == before  # every request rode the same connection


def _closed_since(upstream: RawUpstream, closed: int) -> Callable[[], bool]:
    return lambda: upstream.closed > closed


@pytest.mark.parametrize(
    "path", ["/v1/chunked", "/v1/until-close", "/v1/continue", "/v1/then-close"]
)
def test_bodies_however_delimited(gateway: Process, upstream: RawUpstream, path: str) -> None:
    for n in range(2):  # the second goes on a connection the first left as it should be
        closed = upstream.closed
        status, body, headers = _post(gateway, path, key=f"{path}-{n}")
        if path.endswith("/then-close"):
            # A server that hangs up after a keep-alive response: once it has, the
            # gateway must not reuse the connection. Written on it a moment before,
            # the next request would be answered 502, never sent again: the
            # gateway cannot tell that hang-up from an upstream that computed the
            # answer and dropped the connection (docs/gateway.md, "Gateway retries").
            wait_until(_closed_since(upstream, closed), "the upstream's hang-up")
        assert (status, body) == (200, BODY)
        assert headers["x-request-id"] == "raw-1"
        assert "transfer-encoding" not in {name.lower() for name in headers}
        status, body, headers = _post(gateway, path, key=f"{path}-{n}")  # its replay
        assert (status, body, headers["idempotent-replayed"]) == (200, BODY, "true")


def test_head_has_no_body_and_the_next_request_is_whole(gateway: Process) -> None:
    status, body, headers = _post(gateway, "/v1/models", method="HEAD")
    assert (status, body, headers["content-type"]) == (200, b"", "application/json")
    status, body, _ = _post(gateway, "/v1/chat/completions")
    assert (status, body) == (200, BODY)


def test_fields_the_client_names_in_connection_are_not_forwarded(
    gateway: Process, upstream: RawUpstream
) -> None:
    # RFC 9110 section 7.6.1: a field listed in Connection is for this hop only.
    port = int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer sk-raw\r\nContent-Length: 2\r\n"
            b"Connection: keep-alive, X-Hop-Secret\r\nConnection: x-other-hop\r\n"
            b"X-Hop-Secret: s3cret\r\nX-Other-Hop: 1\r\nX-Kept: yes\r\n\r\n{}"
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += client.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")
    head = upstream.heads[-1].lower()
    assert b"x-kept: yes" in head
    assert b"x-hop-secret" not in head and b"x-other-hop" not in head
