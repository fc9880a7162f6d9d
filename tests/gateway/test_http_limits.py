"""The HTTP layer bounds what a client controls, and every rejection reaches the client.

Real gateway processes on free ports, real sockets, the way the review of issue 12
found the problems: huge and numerous request headers (431), clients trickling
their head or body (408), and early rejections of a body still being sent (413,
400, 405), which must arrive as problem+json responses, never as a reset.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx2 as httpx
import openai
import pytest

from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim, chat, module_gateway
from tests.support.processes import Process

MiB = 1024 * 1024
PROBLEMS = "https://github.com/payonce/payonce/blob/main/docs/problems.md#"


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One default gateway for the module: every test uses keys no other test does,
    counts only the simulator's ledger (emptied by ``fresh_sim``) and has its replies
    before it returns. The memory test (the process's peak RSS) and tests that need
    flags start their own gateway with ``start_gateway``."""
    yield from module_gateway(sim, tmp_path_factory)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool = False  # the gateway closed the connection cleanly (EOF) after the reply
    raw_head: bytes = b""
    problem: dict[str, object] = field(default_factory=dict)


def port_of(gateway: Process) -> int:
    port = urlsplit(gateway.url).port
    assert port is not None
    return port


def read_reply(sock: socket.socket) -> Reply:
    """Read one HTTP/1.1 response (Content-Length framed), then whether EOF follows."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response head: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("connection closed inside the response body")
        body += chunk
    reply = Reply(status, headers, body[:length], raw_head=head)
    if headers.get("content-type") == "application/problem+json":
        reply.problem = json.loads(reply.body)
    if headers.get("connection", "").lower() == "close":
        # A graceful close is a FIN after the response, never a reset.
        reply.closed = sock.recv(65536) == b""
    return reply


def send_then_read(
    gateway: Process, head: bytes, body: Iterable[bytes] = (), timeout: float = 60
) -> Reply:
    """A naive client: send the whole request, only then read the response.

    This is what urllib does; a gateway that answers early and closes without
    reading the rest makes the kernel reset the connection under it.
    """
    with socket.create_connection(("127.0.0.1", port_of(gateway)), timeout=timeout) as sock:
        sock.sendall(head)
        for piece in body:
            sock.sendall(piece)
        return read_reply(sock)


def assert_gateway_problem(reply: Reply, status: int, slug: str) -> None:
    assert reply.status == status, (reply.raw_head, reply.body[:300])
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.problem["status"] == status
    assert reply.problem["type"] == PROBLEMS + slug
    assert reply.problem["title"] and reply.problem["detail"]


def rss_peak_kib(pid: int) -> int:
    """The process's resident-set high-water mark (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def health_ok(gateway: Process) -> bool:
    # Only a multi-second stall fails this: the machine is shared.
    response = httpx.get(gateway.url + "/_payonce/health", timeout=10)
    return response.status_code == 200


def keyed_head(path: str, length: int | None, key: str = "limits-1", extra: bytes = b"") -> bytes:
    framing = (
        b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
    )
    return (
        b"POST " + path.encode() + b" HTTP/1.1\r\nhost: gateway\r\n"
        b"authorization: Bearer sk-test-tenant-a\r\n"
        b"idempotency-key: " + key.encode() + b"\r\n"
        b"content-type: application/json\r\n" + framing + extra + b"\r\n"
    )


def chunked(total: int, piece: int = MiB) -> Iterator[bytes]:
    block = b"x" * piece
    sent = 0
    while sent < total:
        size = min(piece, total - sent)
        yield b"%x\r\n" % size + block[:size] + b"\r\n"
        sent += size
    yield b"0\r\n\r\n"


def fixed(total: int, piece: int = MiB) -> Iterator[bytes]:
    block = b"x" * piece
    sent = 0
    while sent < total:
        size = min(piece, total - sent)
        yield block[:size]
        sent += size


# -- item 2: request heads are bounded --------------------------------------------------


def test_unterminated_huge_headers_do_not_grow_the_gateways_memory(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    """Four connections each sending an unterminated 64 MiB header (the review: +300 MiB)."""
    gateway = start_gateway()  # its own: a shared one's peak RSS holds other tests' bodies
    assert health_ok(gateway)
    before = rss_peak_kib(gateway.popen.pid)
    replies: list[Reply | None] = []
    lock = threading.Lock()

    def attack() -> None:
        reply: Reply | None = None
        with socket.create_connection(("127.0.0.1", port_of(gateway)), timeout=60) as sock:
            block = b"a" * (256 * 1024)
            # Past the bound the gateway may stop reading (then resets): that is the
            # bound working, so a failed send ends the attack quietly.
            with contextlib.suppress(OSError, AssertionError):
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: ")
                for _ in range(64 * MiB // len(block)):
                    sock.sendall(block)
                reply = read_reply(sock)
        with lock:
            replies.append(reply)

    threads = [threading.Thread(target=attack) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.2)
        assert health_ok(gateway), "the gateway stalled under the attack"
    finally:
        for thread in threads:
            thread.join(120)
    after = rss_peak_kib(gateway.popen.pid)
    growth_mib = (after - before) / 1024
    print(f"gateway VmHWM before {before} KiB, after {after} KiB (+{growth_mib:.1f} MiB)")
    assert growth_mib < 24, f"the gateway's peak RSS grew by {growth_mib:.0f} MiB"
    assert health_ok(gateway)
    for reply in replies:
        if reply is not None:
            assert_gateway_problem(reply, 431, "headers-too-large")
    assert fresh_sim.requests() == 0


@pytest.mark.parametrize("size", [1 * MiB, 8 * MiB])
def test_a_huge_header_is_431_from_the_gateway(gateway: Process, fresh_sim: Sim, size: int) -> None:
    head = (
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-a\r\n"
        b"x-big: " + b"a" * size + b"\r\n\r\n"
    )
    reply = send_then_read(gateway, head)
    assert_gateway_problem(reply, 431, "headers-too-large")
    assert reply.headers["connection"] == "close" and reply.closed
    assert reply.headers["x-should-retry"] == "false"
    assert fresh_sim.requests() == 0, "the request reached the upstream"


def test_5000_headers_are_431_from_the_gateway(gateway: Process, fresh_sim: Sim) -> None:
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(5000))
    reply = send_then_read(gateway, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
    assert_gateway_problem(reply, 431, "headers-too-large")
    assert "100" in str(reply.problem["detail"])
    assert fresh_sim.requests() == 0


def test_heads_within_the_limits_are_served(gateway: Process, fresh_sim: Sim) -> None:
    headers = {f"x-h{i}": "v" * 100 for i in range(90)}
    response = chat(gateway.url, "limits-ok", headers=headers)
    assert response.status_code == 200, response.text
    assert fresh_sim.requests() == 1


def test_the_limits_are_flags_and_apply_to_every_worker(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--workers", "2", "--max-headers", "20", "--max-header-bytes", "4KiB")
    for _ in range(4):  # connections land on either worker
        twenty_one = b"".join(b"x-h%d: v\r\n" % i for i in range(20))
        reply = send_then_read(
            gateway, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + twenty_one + b"\r\n"
        )
        assert_gateway_problem(reply, 431, "headers-too-large")
        big = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 5000 + b"\r\n\r\n"
        assert_gateway_problem(send_then_read(gateway, big), 431, "headers-too-large")
    assert fresh_sim.requests() == 0


# -- item 3: slow clients are let go ------------------------------------------------------


class Trickler:
    """Many connections, each sending one byte at a time, watched for what comes back."""

    def __init__(self, gateway: Process, count: int, first: bytes, rest: bytes) -> None:
        self.selector = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        self.received: dict[socket.socket, bytes] = {}
        self.ended: dict[socket.socket, float] = {}
        self.rest = rest
        self.started = time.monotonic()
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port_of(gateway)), timeout=5)
            if first:
                sock.sendall(first)
            sock.setblocking(False)
            self.socks.append(sock)
            self.received[sock] = b""
            self.selector.register(sock, selectors.EVENT_READ)

    def run(self, deadline: float, interval: float = 0.1) -> None:
        position = 0
        end = self.started + deadline
        while len(self.ended) < len(self.socks) and time.monotonic() < end:
            byte = b""
            if self.rest:
                byte = self.rest[position % len(self.rest) : position % len(self.rest) + 1]
                position += 1
            for sock in self.socks:
                if sock not in self.ended and byte:
                    try:
                        sock.send(byte)
                    except OSError:
                        self._end(sock)
            for key, _ in self.selector.select(interval):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    self.received[sock] += chunk
                else:
                    self._end(sock)

    def _end(self, sock: socket.socket) -> None:
        if sock not in self.ended:
            self.ended[sock] = time.monotonic() - self.started
            self.selector.unregister(sock)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.selector.close()


def test_a_request_head_trickled_byte_by_byte_is_408_after_the_header_timeout(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--header-timeout", "1s")
    head = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + b"x-slow: " + b"s" * 10_000
    trickler = Trickler(gateway, 100, b"G", head[1:])
    silent = Trickler(gateway, 20, b"", b"")  # connect and send nothing at all
    try:
        trickler.run(deadline=20)
        assert health_ok(gateway)
        silent.run(deadline=20)
        assert len(trickler.ended) == 100, (
            f"{100 - len(trickler.ended)} trickling connections still held"
        )
        assert len(silent.ended) == 20, f"{20 - len(silent.ended)} silent connections still held"
        for sock in trickler.socks:
            assert trickler.received[sock].startswith(b"HTTP/1.1 408 "), trickler.received[sock][
                :200
            ]
            assert b"application/problem+json" in trickler.received[sock]
            assert b"#request-timeout" in trickler.received[sock]
            assert trickler.ended[sock] >= 0.9  # not before the timeout
        for sock in silent.socks:
            # Nothing of a request arrived: closed without a response, which the
            # client could mistake for the answer to a request it sends next.
            assert silent.received[sock] == b""
    finally:
        trickler.close()
        silent.close()
    assert fresh_sim.requests() == 0


def test_a_request_body_trickled_or_stalled_is_408_after_the_body_timeout(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--body-timeout", "1s")
    head = keyed_head("/v1/chat/completions", 100_000, key="slow-body")
    trickler = Trickler(gateway, 50, head, b"x")  # one byte per 100 ms, forever
    stalled = Trickler(gateway, 10, head + b"x" * 1000, b"")  # part of it, then nothing
    try:
        trickler.run(deadline=20)
        stalled.run(deadline=20)
        assert len(trickler.ended) == 50, f"{50 - len(trickler.ended)} trickling bodies still held"
        assert len(stalled.ended) == 10, f"{10 - len(stalled.ended)} stalled bodies still held"
        for watched in (trickler, stalled):
            for sock in watched.socks:
                assert watched.received[sock].startswith(b"HTTP/1.1 408 "), watched.received[sock][
                    :200
                ]
                assert b"application/problem+json" in watched.received[sock]
                assert b"connection: close" in watched.received[sock].lower()
    finally:
        trickler.close()
        stalled.close()
    assert fresh_sim.requests() == 0
    assert chat(gateway.url, "slow-body").status_code == 200, "the key was left claimed"


def test_a_large_body_sent_normally_is_not_cut_by_the_timeouts(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--body-timeout", "1s", "--header-timeout", "1s")
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * (9 * MiB)}]}
    with httpx.Client(timeout=60) as client:  # one keep-alive connection, two requests
        for key in ("big-1", "big-2"):
            response = client.post(
                gateway.url + "/v1/chat/completions",
                json=body,
                headers={**AUTH, "Idempotency-Key": key},
            )
            assert response.status_code == 200, response.text
    assert fresh_sim.requests() == 2


# -- item 4: early rejections are answered, whatever the client ----------------------------


def urllib_post(
    url: str, body: bytes | Iterable[bytes], headers: dict[str, str]
) -> urllib.error.HTTPError:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    return caught.value


def assert_urllib_problem(error: urllib.error.HTTPError, status: int, slug: str) -> None:
    assert error.code == status
    assert error.headers["content-type"] == "application/problem+json"
    assert error.headers["connection"] == "close"
    problem = json.loads(error.read())
    assert problem["status"] == status and problem["type"] == PROBLEMS + slug


@pytest.mark.parametrize("size", [10 * MiB + 1, 12 * MiB, 50 * MiB])
def test_urllib_posting_a_body_over_max_body_gets_the_413(
    gateway: Process, fresh_sim: Sim, size: int
) -> None:
    body = b"x" * size
    for attempt in range(3):
        error = urllib_post(
            gateway.url + "/v1/chat/completions",
            body,
            {
                **AUTH,
                "Idempotency-Key": f"big-{size}-{attempt}",
                "Content-Type": "application/json",
            },
        )
        assert_urllib_problem(error, 413, "body-too-large")
        assert error.headers["x-should-retry"] == "false"
    assert fresh_sim.requests() == 0


@pytest.mark.parametrize("size", [12 * MiB, 50 * MiB])
@pytest.mark.parametrize("connection", [b"", b"connection: close\r\n"])
def test_a_chunked_body_over_max_body_gets_the_413(
    gateway: Process, fresh_sim: Sim, size: int, connection: bytes
) -> None:
    for attempt in range(3):
        key = f"chunked-{size}-{len(connection)}-{attempt}"
        head = keyed_head("/v1/chat/completions", None, key=key, extra=connection)
        reply = send_then_read(gateway, head, chunked(size))
        assert_gateway_problem(reply, 413, "body-too-large")
        # The rest of the body is not read: the connection ends, announced and clean.
        assert reply.headers["connection"] == "close" and reply.closed
    assert fresh_sim.requests() == 0


def test_a_content_length_body_over_max_body_on_a_raw_socket_gets_the_413(
    gateway: Process, fresh_sim: Sim
) -> None:
    for _ in range(3):
        head = keyed_head("/v1/chat/completions", 50 * MiB)
        reply = send_then_read(gateway, head, fixed(50 * MiB))
        assert_gateway_problem(reply, 413, "body-too-large")
        assert reply.headers["connection"] == "close" and reply.closed
    assert fresh_sim.requests() == 0


def test_a_body_behind_an_invalid_key_gets_the_400(gateway: Process, fresh_sim: Sim) -> None:
    for _ in range(3):
        error = urllib_post(
            gateway.url + "/v1/chat/completions",
            b"x" * (5 * MiB),
            {**AUTH, "Idempotency-Key": "not a valid key", "Content-Type": "application/json"},
        )
        assert_urllib_problem(error, 400, "invalid-key")
    assert fresh_sim.requests() == 0


def test_a_body_posted_to_health_gets_the_405(gateway: Process) -> None:
    for _ in range(3):
        error = urllib_post(gateway.url + "/_payonce/health", b"x" * (5 * MiB), {})
        assert_urllib_problem(error, 405, "method-not-allowed")


def test_urllib_chunked_body_over_max_body_gets_the_413(gateway: Process, fresh_sim: Sim) -> None:
    for _ in range(3):
        error = urllib_post(
            gateway.url + "/v1/chat/completions",
            iter([b"x" * MiB] * 12),
            {**AUTH, "Idempotency-Key": "chunked-urllib", "Transfer-Encoding": "chunked"},
        )
        assert_urllib_problem(error, 413, "body-too-large")
    assert fresh_sim.requests() == 0


def test_the_openai_sdk_gets_the_413(gateway: Process, fresh_sim: Sim) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test", timeout=60)
    client._idempotency_header = "Idempotency-Key"
    huge = [{"role": "user", "content": "x" * (12 * MiB)}]
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=huge)
    assert caught.value.status_code == 413
    assert caught.value.response.headers["content-type"] == "application/problem+json"
    assert fresh_sim.requests() == 0


def test_keep_alive_survives_a_body_spread_over_many_reads_and_idles_out(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--keep-alive-timeout", "1s")
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 300_000}]}).encode()
    with socket.create_connection(("127.0.0.1", port_of(gateway)), timeout=30) as sock:
        for key in ("spread-1", "spread-2"):
            sock.sendall(keyed_head("/v1/chat/completions", len(body), key=key))
            for start in range(0, len(body), 100_000):
                sock.sendall(body[start : start + 100_000])
                time.sleep(0.05)  # separate reads on the gateway's side
            reply = read_reply(sock)
            assert reply.status == 200, reply.body[:300]
            assert reply.headers.get("connection") != "close"
        started = time.monotonic()
        assert sock.recv(1) == b"", "an idle kept-alive connection is closed"
        assert time.monotonic() - started >= 0.5
    assert fresh_sim.requests() == 2
