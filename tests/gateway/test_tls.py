"""TLS both ways: the gateway serving HTTPS to the official openai SDK, and a Redis store over ``rediss://``.

The certificates are made by the test (tests/support/tls.py): a CA of its own
and a certificate for 127.0.0.1. The SDK trusts only that CA, so a handshake
with anything else fails; the Redis server listens with TLS on a second port
and the gateway reaches it through ``rediss://...?ssl_ca_certs=CA``, which
redis-py reads from the URL.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
import redis

from tests.support.processes import Process, start_payonce
from tests.support.redis import RedisServer, running_redis
from tests.support.sim import Sim
from tests.support.tls import Certificates, make_certificates

MESSAGES = [{"role": "user", "content": "Is this line private?"}]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_redis(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis-tls"), tls=certs) as server:
        yield server


@pytest.fixture(scope="module")
def https_gateway(
    sim: Sim, certs: Certificates, tls_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    args = ["serve", "--upstream", sim.url, "--store", tls_redis.tls_url]
    args += ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    process = start_payonce(
        args,
        log_dir=tmp_path_factory.mktemp("gateway"),
        ready_path="/_payonce/health",
        tls=certs.client_context(),
    )
    try:
        yield process
    finally:
        process.stop()


def _client(url: str, certs: Certificates) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url + "/v1",
        api_key="sk-test-tls",
        http_client=openai.DefaultHttpxClient(verify=certs.client_context()),
    )


def _create(client: openai.OpenAI, key: str) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=16,
        extra_headers={"Idempotency-Key": key},
    )
    return raw.parse().id, raw.headers["idempotent-replayed"]


def test_the_openai_sdk_over_https_gets_its_replay_from_redis_over_tls(
    https_gateway: Process, certs: Certificates, tls_redis: RedisServer, fresh_sim: Sim
) -> None:
    assert https_gateway.url.startswith("https://")
    key = f"tls-{uuid.uuid4()}"
    with _client(https_gateway.url, certs) as client:
        first, replayed = _create(client, key)
        assert replayed == "false"
        assert _create(client, key) == (first, "true")
    assert fresh_sim.billed() == 1
    # The record went over TLS: read it back through the TLS port alone.
    with redis.Redis(
        host="127.0.0.1", port=tls_redis.tls_port, ssl=True, ssl_ca_certs=str(certs.ca)
    ) as over_tls:
        assert any(key.encode() in name for name in over_tls.keys("*"))
    assert "https://127.0.0.1" in https_gateway.output()


def test_a_client_that_does_not_trust_the_certificate_is_refused(
    https_gateway: Process, certs: Certificates
) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(https_gateway.url + "/_payonce/health", verify=ssl.create_default_context())
    answer = httpx.get(https_gateway.url + "/_payonce/health", verify=certs.client_context())
    assert answer.json() == {"status": "ok", "store": "ok"}


def test_https_with_two_workers(fresh_sim: Sim, certs: Certificates, tmp_path: Path) -> None:
    args = ["serve", "--upstream", fresh_sim.url, "--store", f"sqlite:///{tmp_path}/p.db"]
    args += ["--workers", "2", "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    gateway = start_payonce(
        args, log_dir=tmp_path, ready_path="/_payonce/health", tls=certs.client_context()
    )
    try:
        key = f"tls-workers-{uuid.uuid4()}"
        with _client(gateway.url, certs) as client:
            first, _ = _create(client, key)
        for _ in range(4):  # new connections, to either worker
            with _client(gateway.url, certs) as client:
                assert _create(client, key) == (first, "true")
    finally:
        gateway.stop()
    assert fresh_sim.billed() == 1
    assert "Traceback" not in gateway.output()


@pytest.mark.parametrize("case", ["key alone", "wrong key", "not pem"])
def test_bad_tls_files_are_one_line_and_exit_code_2(
    case: str, certs: Certificates, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    flags = {
        "key alone": ["--tls-key", str(certs.key)],
        "wrong key": ["--tls-cert", str(certs.cert), "--tls-key", str(other.key)],
        "not pem": ["--tls-cert", str(junk), "--tls-key", str(certs.key)],
    }[case]
    done = subprocess.run(
        [sys.executable, "-m", "payonce", "serve", "--store", "memory://", *flags],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("payonce: error: --tls-")


# -- the upstream over HTTPS: what every real provider is ---------------------------------


def _front(upstream: str, tmp_path: Path, env: dict[str, str]) -> Process:
    """A plain-HTTP gateway whose upstream is ``upstream`` (the HTTPS gateway)."""
    args = ["serve", "--upstream", upstream, "--store", f"sqlite:///{tmp_path}/front.db"]
    return start_payonce(args, log_dir=tmp_path, ready_path="/_payonce/health", env=env)


def _post(url: str, key: str, *, stream: bool = False) -> httpx.Response:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 8, "stream": stream}
    headers = {"Authorization": "Bearer sk-test-tls", "Idempotency-Key": key}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_an_https_upstream_is_reached_verified_and_its_answers_replayed(
    https_gateway: Process, certs: Certificates, fresh_sim: Sim, tmp_path: Path
) -> None:
    # The upstream's certificate is checked against the CAs OpenSSL trusts, which
    # SSL_CERT_FILE names: here the test's own CA, as a private CA would be.
    front = _front(https_gateway.url, tmp_path, {"SSL_CERT_FILE": str(certs.ca)})
    try:
        key = f"up-tls-{uuid.uuid4()}"
        first = _post(front.url, key)
        assert first.status_code == 200, first.text
        assert first.headers["idempotent-replayed"] == "false"
        again = _post(front.url, key)
        assert (again.content, again.headers["idempotent-replayed"]) == (first.content, "true")
        streamed = _post(front.url, f"up-tls-stream-{uuid.uuid4()}", stream=True)
        assert streamed.status_code == 200
        events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) > 2
        assert fresh_sim.billed() == 2
    finally:
        front.stop()


def test_an_https_upstream_with_a_certificate_nobody_trusts_is_a_502_and_no_bill(
    https_gateway: Process, fresh_sim: Sim, tmp_path: Path
) -> None:
    front = _front(https_gateway.url, tmp_path, {"SSL_CERT_FILE": ""})
    try:
        answer = _post(front.url, f"up-untrusted-{uuid.uuid4()}")
        assert answer.status_code == 502, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["type"].endswith("#upstream-unavailable")
        assert fresh_sim.billed() == 0
    finally:
        front.stop()
    assert "Traceback" not in front.output()
