"""Request targets the upstream URL cannot be built from, and streams that die mid-way.

Issue 12, item 8: ``OPTIONS *`` and ``GET *`` answered 500 with a traceback (the
upstream URL could not be built from ``*``), and an upstream stream dying after
its response had started logged an ASGI protocol error (unkeyed: the gateway
tried to send a problem response after the stream began; keyed: uvicorn's
"returned without completing response"). Driven over raw sockets, the way the
review found it.
"""

from __future__ import annotations

import json
import socket
import time
import uuid

from tests.gateway.conftest import AUTH, CHAT, GatewayFactory
from tests.support.processes import Process
from tests.support.waiting import wait_until

STREAM = {**CHAT, "stream": True}


def _exchange(gateway: Process, request: bytes, timeout: float = 10.0) -> bytes:
    """Send ``request`` on a fresh connection and read until the server closes it."""
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return received
            received += chunk


def _head_and_body(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def _post(path: str, body: dict[str, object], headers: dict[str, str]) -> bytes:
    payload = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def _log_after(gateway: Process, expected: str | None = None, settle: float = 0.3) -> str:
    """The gateway's log once it has ``expected`` (written as the request ends), and ``settle``
    seconds more for anything that should not be there."""
    if expected is not None:
        wait_until(lambda: expected in gateway.output(), f"{expected!r} in the gateway's log")
    time.sleep(settle)
    return gateway.output()


def _assert_no_protocol_errors(log: str) -> None:
    assert "Traceback" not in log, log
    assert "Expected ASGI message" not in log, log
    assert "without completing response" not in log, log
    assert "Exception in ASGI application" not in log, log


def test_options_asterisk_is_answered_by_the_gateway(gateway: Process) -> None:
    answer = _exchange(gateway, b"OPTIONS * HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
    status, headers, body = _head_and_body(answer)
    assert status == 200
    assert "POST" in headers["allow"] and "OPTIONS" in headers["allow"]
    assert headers["content-length"] == "0" and body == b""
    _assert_no_protocol_errors(_log_after(gateway))


def test_other_methods_on_asterisk_get_a_problem_not_a_500(gateway: Process) -> None:
    for method in ("GET", "POST", "HEAD"):
        request = f"{method} * HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
        request += "Content-Length: 0\r\n\r\n"
        status, headers, body = _head_and_body(_exchange(gateway, request.encode()))
        assert status == 400, (method, status, body)
        assert headers["content-type"] == "application/problem+json"
        assert headers["x-should-retry"] == "false"
        if method != "HEAD":
            assert json.loads(body)["type"].endswith("#bad-request-target")
    _assert_no_protocol_errors(_log_after(gateway))


def _broken_stream(gateway: Process, key: str | None) -> bytes:
    headers = {**AUTH, "X-Sim-Die-After": "3"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return _exchange(gateway, _post("/v1/chat/completions", STREAM, headers))


def test_an_unkeyed_stream_that_dies_is_broken_for_the_client_and_logged_in_one_line(
    start_gateway: GatewayFactory,
) -> None:
    gateway = start_gateway()
    answer = _broken_stream(gateway, None)
    status, headers, body = _head_and_body(answer)
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert not body.endswith(b"0\r\n\r\n"), "the client must see a broken stream, not a short one"
    log = _log_after(gateway, "broke off")
    _assert_no_protocol_errors(log)
    broken = [line for line in log.splitlines() if "broke off" in line]
    assert len(broken) == 1, log
    assert "/v1/chat/completions" in broken[0]


def test_a_keyed_stream_that_dies_is_broken_for_the_client_and_logged_in_one_line(
    start_gateway: GatewayFactory,
) -> None:
    gateway = start_gateway()
    key = f"dies-{uuid.uuid4()}"
    answer = _broken_stream(gateway, key)
    status, _, body = _head_and_body(answer)
    assert status == 200
    assert not body.endswith(b"0\r\n\r\n")
    log = _log_after(gateway, "broke off")
    _assert_no_protocol_errors(log)
    broken = [line for line in log.splitlines() if "broke off" in line]
    assert len(broken) == 1, log
    assert key in broken[0]


def test_requests_that_are_not_http_get_a_problem_document(gateway: Process) -> None:
    for request in (
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost gateway\r\n\r\n",
        b"POST /v1/x HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ):
        answer = _exchange(gateway, request)
        assert answer, (request, gateway.output())
        status, headers, body = _head_and_body(answer)
        assert status == 400, request
        assert headers["content-type"] == "application/problem+json"
        assert headers["connection"] == "close"
        assert json.loads(body)["type"].endswith("#malformed-request")
