"""Header handling, from raw sockets against a live gateway.

Every request gets an HTTP answer, never a reset or a 5xx: the upstream's, or
one of the gateway's problem documents. Huge, repeated and undecodable header
fields included.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.conftest import LIVE
from tests.support.processes import Process, start_payonce
from tests.support.sim import Sim

BODY = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
_keys = itertools.count()


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("headers")
    process = start_payonce(
        ["serve", "--upstream", sim.url, "--store", f"sqlite:///{tmp}/payonce.db"],
        log_dir=tmp,
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()
        assert "Traceback" not in process.output(), process.output()[-3000:]


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
        head += b"Idempotency-Key: fuzz-%d\r\n" % next(_keys)
    return head + b"".join(name + b": " + value + b"\r\n" for name, value in fields)


names = st.sampled_from(
    [
        b"Idempotency-Key",
        b"X-Idempotency-Key",
        b"Authorization",
        b"X-Api-Key",
        b"Last-Event-ID",
        b"Content-Type",
        b"X-Custom",
        b"Accept-Encoding",
        b"X-\xff\xfe",
        b"Bad Name",
        b"",
    ]
)
values = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [b"\xe9t\xe9", b"\xff\xfe", b'"quoted key"', b"a, b", b"a,b", b"\x00", b"Bearer "]
    ),
)


@LIVE
@given(st.lists(st.tuples(names, values), max_size=6))
@example([(b"Idempotency-Key", b"same"), (b"Idempotency-Key", b"same")])
@example([(b"Idempotency-Key", b"one"), (b"Idempotency-Key", b"two")])
@example([(b"X-Api-Key", b"\xff\xfe"), (b"Idempotency-Key", b"latin-credential")])
@example([(b"Idempotency-Key", b"\xe9t\xe9")])
@example([(b"Content-Type", b"\xff/json")])
@example([(b"X-Custom", b"a\rb")])
def test_any_header_fields_get_an_answer(
    gateway: Process, fields: list[tuple[bytes, bytes]]
) -> None:
    answered_well(*exchange(gateway, request(fields, keyed=True)))


@LIVE
@given(
    st.integers(min_value=60_000, max_value=300_000),
    st.sampled_from([b"X-Big", b"Idempotency-Key"]),
)
@example(65_536, b"X-Big")
def test_a_huge_header_is_served_or_431(gateway: Process, size: int, name: bytes) -> None:
    status, headers, body = exchange(
        gateway, request([(name, b"k" * size)], keyed=name == b"X-Big")
    )
    answered_well(status, headers, body)
    assert status in (200, 400, 431), status


@LIVE
@given(st.integers(min_value=1, max_value=400))
def test_repeated_key_headers_are_one_key_or_431(gateway: Process, count: int) -> None:
    key = b"repeated-%d" % next(_keys)
    fields = [(b"Authorization", b"Bearer sk-repeat")] + [(b"Idempotency-Key", key)] * count
    status, headers, body = exchange(gateway, request(fields))
    answered_well(status, headers, body)
    if count + 4 > 100:  # Host, Content-Type, Content-Length and Connection besides
        assert status == 431
        return
    assert status == 200 and headers[b"idempotent-replayed"] == b"false"
    again = exchange(gateway, request(fields[:2]))
    assert again[0] == 200 and again[1][b"idempotent-replayed"] == b"true"
