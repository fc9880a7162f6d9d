"""What a failing store tells callers, and what it tells the operator (issue 29, defect 8).

With a stalled Redis, ``/_payonce/health`` (no credential needed) and keyed
requests answered with the Redis client's own message: "Timeout reading from
10.1.2.3:6379", "DB index is out of range", which tells anyone where the store
is and how it is set up. Callers now get the problem type and a fixed detail;
the gateway's log has the store's message, once per distinct failure.

Real processes: a Redis server of the test's own, SIGSTOPped (it keeps its
port open and answers nothing), a gateway with ``?timeout=0.5`` in its store
URL, and the simulator as the upstream.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from payonce.clock import ManualClock
from payonce.errors import StorageError, StorageTimeout
from payonce.gateway.store_failures import StoreFailures
from tests.gateway.conftest import CHAT, GatewayFactory, Sim, chat
from tests.support.processes import start_payonce
from tests.support.redis import RedisServer, running_redis
from tests.support.waiting import wait_until


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    with running_redis(tmp_path / "redis") as server:
        yield server


def _private(body: bytes, redis: RedisServer, *secrets: str) -> None:
    """The answer names neither the store's address nor its client's message."""
    text = body.decode()
    for secret in ("127.0.0.1", str(redis.port), "Timeout reading", "Redis", *secrets):
        assert secret not in text, f"{secret!r} in {text}"


def test_a_stalled_redis_is_a_fixed_problem_for_callers_and_a_log_line_for_the_operator(
    start_gateway: GatewayFactory, fresh_sim: Sim, redis: RedisServer
) -> None:
    gateway = start_gateway("--no-otel", store=redis.url + "?timeout=0.5")
    assert chat(gateway.url, "before").status_code == 200
    assert redis.popen is not None
    os.kill(redis.popen.pid, signal.SIGSTOP)
    try:
        answers = [httpx.get(gateway.url + "/_payonce/health", timeout=30) for _ in range(3)]
        answers.append(chat(gateway.url, "during"))
        answers.append(httpx.get(gateway.url + "/_payonce/requests/before", timeout=30))
    finally:
        os.kill(redis.popen.pid, signal.SIGCONT)
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert problem["type"].endswith("#store-timeout"), problem
        assert problem["detail"] == problem["message"]
        _private(answer.content, redis)
    # One detail, whatever the failure said: callers can match on it.
    assert len({answer.json()["detail"] for answer in answers}) == 1
    assert fresh_sim.billed() == 1, "nothing ran while the store was down"
    log = gateway.output()
    failure = f"Redis store at 127.0.0.1:{redis.port} did not answer within 0.5 s"
    assert failure in log, log[-3000:]
    # Once per distinct failure, not once per request (five answered it).
    answered = [line for line in log.splitlines() if failure in line and "answered 503" in line]
    assert len(answered) == 1, log[-3000:]
    assert chat(gateway.url, "during").headers["idempotent-replayed"] == "false"


def test_a_redis_database_that_does_not_exist_is_not_named_to_callers(
    fresh_sim: Sim, redis: RedisServer, tmp_path: Path
) -> None:
    # Redis has 16 databases by default: SELECT 99 fails with "DB index is out of range".
    store = f"redis://127.0.0.1:{redis.port}/99?timeout=2"
    args = ["serve", "--upstream", fresh_sim.url, "--store", store, "--no-otel"]
    gateway = start_payonce(args, log_dir=tmp_path, ready_path="/_payonce/openapi.json")
    try:
        health = httpx.get(gateway.url + "/_payonce/health", timeout=30)
        keyed = httpx.post(
            gateway.url + "/v1/chat/completions",
            json=CHAT,
            headers={"Idempotency-Key": "db-99"},
            timeout=30,
        )
        for answer in (health, keyed):
            assert answer.status_code == 503, answer.text
            assert answer.headers["content-type"] == "application/problem+json"
            assert json.loads(answer.content)["type"].endswith("#store-unavailable")
            _private(answer.content, redis, "DB index", "out of range", "99")
        wait_until(lambda: "DB index is out of range" in gateway.output(), "the operator's line")
        assert fresh_sim.billed() == 0
    finally:
        gateway.stop()


def test_each_distinct_failure_is_logged_once_a_minute_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    failures = StoreFailures(clock, "redis://payonce:s3cret@10.1.2.3:6379/0")
    stalled = StorageTimeout("Timeout reading from 10.1.2.3:6379 (auth s3cret)")
    caplog.set_level(logging.WARNING, logger="payonce.gateway")
    problems = [failures.answer(stalled) for _ in range(5)]
    failures.answer(StorageError("DB index is out of range"))
    assert {(p.status, p.slug, p.detail) for p in problems} == {
        (503, "store-timeout", problems[0].detail)
    }
    clock.advance(61)
    failures.answer(stalled)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    assert "Timeout reading from 10.1.2.3:6379 (auth ***)" in lines[0]
    assert "DB index is out of range" in lines[1]
    assert "4 more since the last line" in lines[2]
    assert not any("s3cret" in line for line in lines)
