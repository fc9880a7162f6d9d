"""Requests at the edges of HTTP/1.1, from the outside (issue 29, "also found").

Each was answered wrongly: an ``Expect`` other than ``100-continue`` was
forwarded, and the upstream's plain-text 417 relayed (and, keyed, stored); an
HTTP/1.1 request without ``Host`` was forwarded; ``/_payonce/requests/%22k1%22``
was 404 though the header ``"k1"`` is key ``k1``; a HEAD answered
``content-length: 0``; ``Transfer-Encoding: gzip, chunked`` was de-chunked and
forwarded still gzipped; an encrypted TLS key made OpenSSL ask for a pass
phrase on the terminal (or read one from standard input) before exiting.

Raw sockets where a client library would not send the request, urllib
otherwise; a real simulator behind a real gateway.
"""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.gateway.conftest import AUTH, Sim, chat, module_gateway
from tests.support.processes import Process, free_port
from tests.support.tls import make_certificates

BODY = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


def _exchange(gateway: Process, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` on a new connection and read the answer to the connection's end."""
    port = int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 1"):  # an interim answer (100 Continue)
        head, _, body = body.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def _post(fields: bytes, body: bytes = BODY, version: bytes = b"HTTP/1.1") -> bytes:
    return (
        b"POST /v1/chat/completions " + version + b"\r\n" + fields
        + b"Authorization: Bearer sk-edges\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    )  # fmt: skip


def _problem(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, str]:
    status, headers, body = answer
    assert headers["content-type"] == "application/problem+json", (status, headers, body)
    document = json.loads(body)
    assert document["status"] == status
    return status, str(document["type"]).rsplit("#", 1)[1]


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One gateway for the module: every test uses keys no other test does (or
    none), counts only the simulator's ledger (emptied by ``fresh_sim``) and has
    its answers before it returns."""
    yield from module_gateway(sim, tmp_path_factory, "--no-otel")


# --- Expect -----------------------------------------------------------------------------


@pytest.mark.parametrize("expect", [b"foo", b"100-continue, foo", b"200-ok"])
def test_an_expectation_other_than_100_continue_is_a_417_problem(
    gateway: Process, fresh_sim: Sim, expect: bytes
) -> None:
    for key in (b"", b"Idempotency-Key: expect-%s\r\n" % expect.replace(b" ", b"")):
        answer = _exchange(gateway, _post(b"Host: gw\r\nExpect: " + expect + b"\r\n" + key))
        assert _problem(answer) == (417, "expectation-failed")
        assert answer[1]["x-should-retry"] == "false"
    assert fresh_sim.requests() == 0, "nothing reached the upstream"


def test_100_continue_still_works(gateway: Process, fresh_sim: Sim) -> None:
    status, _, body = _exchange(gateway, _post(b"Host: gw\r\nExpect: 100-Continue\r\n"))
    assert status == 200, body
    assert fresh_sim.billed() == 1


# --- Host -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields", [b"", b"Host: a\r\nHost: b\r\n", b"Host:\r\n"], ids=["none", "two", "empty"]
)
def test_an_http_1_1_request_without_one_host_is_400(
    gateway: Process, fresh_sim: Sim, fields: bytes
) -> None:
    for key in (b"", b"Idempotency-Key: no-host-%d\r\n" % len(fields)):
        answer = _exchange(gateway, _post(fields + key))
        assert _problem(answer) == (400, "malformed-request")
        assert answer[1]["connection"] == "close"
    assert fresh_sim.requests() == 0


def test_an_http_1_0_request_needs_no_host(gateway: Process, fresh_sim: Sim) -> None:
    status, _, body = _exchange(gateway, _post(b"", version=b"HTTP/1.0"))
    assert status == 200, body
    assert fresh_sim.billed() == 1


# --- the key in the status endpoint's path ------------------------------------------------


def test_the_key_in_the_path_is_read_as_the_header_is(gateway: Process, fresh_sim: Sim) -> None:
    assert chat(gateway.url, "k1").status_code == 200
    assert chat(gateway.url, '"a\\"b"').status_code == 200  # the key a"b
    for path, key in (
        ("k1", "k1"),
        ("%22k1%22", "k1"),
        ('"k1"', "k1"),
        ("%22a%5C%22b%22", 'a"b'),
        ("a%22b", 'a"b'),
    ):
        request = urllib.request.Request(f"{gateway.url}/_payonce/requests/{path}", headers=AUTH)
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["key"] == key, path
    for bad in ("%22k1", "%22k1%22x", "%22a%5Cb%22"):
        request = urllib.request.Request(f"{gateway.url}/_payonce/requests/{bad}", headers=AUTH)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        refused.value.close()
        assert refused.value.code == 400, bad
        assert refused.value.headers["content-type"] == "application/problem+json"


# --- HEAD -------------------------------------------------------------------------------


def _head(url: str, key: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = dict(AUTH)
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(url + "/v1/models", headers=headers, method="HEAD")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()


@pytest.mark.parametrize("key", [None, "head-1"])
def test_a_head_tells_the_length_a_get_would_have(
    gateway: Process, fresh_sim: Sim, key: str | None
) -> None:
    with urllib.request.urlopen(fresh_sim.url + "/v1/models", timeout=30) as direct:
        length = len(direct.read())
    assert length > 0
    status, headers, body = _head(gateway.url, key)
    assert (status, body) == (200, b"")
    assert headers["content-length"] == str(length)
    # A HEAD is safe: forwarded as if it had no key, nothing claimed or stored.
    assert "idempotent-replayed" not in headers
    if key is not None:
        status_request = urllib.request.Request(
            f"{gateway.url}/_payonce/requests/{key}", headers=AUTH
        )
        with pytest.raises(urllib.error.HTTPError) as unknown:
            urllib.request.urlopen(status_request, timeout=30)
        unknown.value.close()
        assert unknown.value.code == 404
        # The same key on a GET is a new key, not a mismatch with the HEAD.
        request = urllib.request.Request(
            gateway.url + "/v1/models", headers={**AUTH, "Idempotency-Key": key}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["idempotent-replayed"] == "false"
            assert len(response.read()) == length


# --- Transfer-Encoding ------------------------------------------------------------------


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"gzip", b"chunked, chunked"])
def test_a_transfer_coding_other_than_chunked_is_refused(
    gateway: Process, fresh_sim: Sim, coding: bytes
) -> None:
    payload = gzip.compress(BODY) if coding.startswith(b"gzip") else BODY
    chunked = b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n"
    for key in (b"", b"Idempotency-Key: te-%d\r\n" % len(coding)):
        data = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n" + key
            + b"Authorization: Bearer sk-edges\r\nContent-Type: application/json\r\n"
            + b"Transfer-Encoding: " + coding + b"\r\nConnection: close\r\n\r\n" + chunked
        )  # fmt: skip
        answer = _exchange(gateway, data)
        if coding != b"gzip, chunked":
            # Chunked not last, or twice: no coding the gateway lacks, but a body
            # whose end cannot be found (RFC 9112 section 6.3): malformed.
            assert _problem(answer) == (400, "malformed-request")
        else:
            assert _problem(answer) == (501, "transfer-coding-not-implemented"), answer
        assert answer[1]["connection"] == "close"
    assert fresh_sim.requests() == 0


def test_a_chunked_body_is_still_read(gateway: Process, fresh_sim: Sim) -> None:
    chunked = b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n"
    data = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-edges\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
    ) + chunked
    status, _, body = _exchange(gateway, data)
    assert status == 200, body
    assert fresh_sim.billed() == 1


# --- an encrypted TLS key ---------------------------------------------------------------


def test_an_encrypted_tls_key_is_a_one_line_error_without_a_prompt(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    key = serialization.load_pem_private_key(certs.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass phrase"),
        )
    )
    args = [sys.executable, "-m", "payonce", "serve", "--upstream", "http://127.0.0.1:9"]
    args += ["--store", "memory://", "--port", str(free_port())]
    args += ["--tls-cert", str(certs.cert), "--tls-key", str(encrypted)]
    # Standard input open and never written: a prompt that falls back to it (no
    # terminal in a new session) would wait here forever.
    process = subprocess.Popen(
        args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"still running after 60 s, waiting for a pass phrase: {err!r}")
    assert process.returncode == 2, (out, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "--tls-key" in lines[0] and "encrypted" in lines[0], lines
    assert b"Enter PEM pass phrase" not in err
