"""Nothing is learned from the status endpoint about other tenants' keys (issue 18).

``GET /_payonce/requests/{key}`` (and ``/response``) with tenant B's credential
for a key tenant A used, and for a key nobody used, must give the same answer:
status, headers, body (the key itself aside), and the same timing. Timing is
compared over 200 requests of each kind, interleaved on one kept-alive
connection so that the machine's load falls on both alike: the medians, and a
Mann-Whitney rank test. The bound is generous on purpose: it fails only for a
real difference in the work done, such as a store lookup in one path and not in
the other (about a tenth of such a request on SQLite, more on Redis), not for
a noisy machine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import statistics
import time
from collections.abc import Iterator

import pytest

from tests.support.processes import Process, start_payonce
from tests.support.redis import running_redis
from tests.support.sim import Sim

SAMPLES = 200
BODY = json.dumps(
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
)


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def gateway(
    request: pytest.FixtureRequest, sim: Sim, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    directory = tmp_path_factory.mktemp(f"probe-{request.param}")
    redis_server = (
        running_redis(tmp_path_factory.mktemp("redis"))
        if request.param == "redis"
        else contextlib.nullcontext(None)
    )
    with redis_server as redis:
        store = redis.url if redis is not None else f"sqlite:///{directory}/payonce.db"
        process = start_payonce(
            ["serve", "--upstream", sim.url, "--store", store],
            log_dir=directory,
            ready_path="/_payonce/health",
        )
        try:
            _used_by_a(process)
            yield process
        finally:
            process.stop()


def _connection(gateway: Process) -> http.client.HTTPConnection:
    host, port = gateway.url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _used(index: int) -> str:
    return f"used-{index:04d}"


def _unused(index: int) -> str:
    return f"none-{index:04d}"  # as long as a used key, so the answers are as long


def _used_by_a(gateway: Process) -> None:
    """Tenant A completes SAMPLES keys."""
    connection = _connection(gateway)
    for index in range(SAMPLES):
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=BODY,
            headers={
                "Authorization": "Bearer sk-tenant-a",
                "Idempotency-Key": _used(index),
                "Content-Type": "application/json",
            },
        )
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200
    connection.close()


def _ask(connection: http.client.HTTPConnection, path: str) -> tuple[float, int, list[str], str]:
    """One status request as tenant B: (seconds, status, headers, body)."""
    started = time.perf_counter()
    connection.request("GET", path, headers={"Authorization": "Bearer sk-tenant-b"})
    answer = connection.getresponse()
    body = answer.read()
    took = time.perf_counter() - started
    headers = [f"{name.lower()}: {value}" for name, value in answer.getheaders()]
    return took, answer.status, headers, body.decode()


def _rank_test_z(first: list[float], second: list[float]) -> float:
    """Mann-Whitney U, normal approximation (ties get their mean rank): its z score."""
    ranked = sorted([(value, 0) for value in first] + [(value, 1) for value in second])
    ranks = [0.0] * len(ranked)
    start = 0
    while start < len(ranked):
        end = start
        while end + 1 < len(ranked) and ranked[end + 1][0] == ranked[start][0]:
            end += 1
        for index in range(start, end + 1):
            ranks[index] = (start + end) / 2 + 1
        start = end + 1
    n1, n2 = len(first), len(second)
    rank_sum = sum(rank for rank, (_, group) in zip(ranks, ranked, strict=True) if group == 0)
    u = rank_sum - n1 * (n1 + 1) / 2
    return (u - n1 * n2 / 2) / math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)


@pytest.mark.parametrize("suffix", ["", "/response"])
def test_another_tenants_key_looks_like_no_key_at_all(gateway: Process, suffix: str) -> None:
    connection = _connection(gateway)
    for index in range(20):  # warm up: connection, caches, the tenant's hash
        _ask(connection, f"/_payonce/requests/{_unused(index + SAMPLES)}{suffix}")
    times: dict[str, list[float]] = {"used": [], "unused": []}
    answers: dict[str, set[tuple[int, tuple[str, ...], str]]] = {"used": set(), "unused": set()}
    for index in range(SAMPLES):
        # Alternate which kind goes first, so neither always follows the other.
        pairs = [("used", _used(index)), ("unused", _unused(index))]
        for kind, key in pairs if index % 2 else reversed(pairs):
            took, status, headers, body = _ask(connection, f"/_payonce/requests/{key}{suffix}")
            times[kind].append(took)
            answers[kind].add((status, tuple(headers), body.replace(key, "KEY")))
    connection.close()
    # The same answer, byte for byte, whatever the key: a 404 for this credential.
    assert len(answers["used"]) == 1, answers["used"]
    assert answers["used"] == answers["unused"]
    status, _, body = next(iter(answers["used"]))
    assert status == 404
    assert json.loads(body)["type"].endswith("problems.md#not-found")
    # The same time. A store lookup in one path only adds tens of microseconds
    # (SQLite) to a few hundred (Redis) to requests of a few hundred: fail only
    # when the ranks say so beyond doubt and the medians differ by more than 8%.
    used, unused = statistics.median(times["used"]), statistics.median(times["unused"])
    z = _rank_test_z(times["used"], times["unused"])
    difference = abs(used - unused) / min(used, unused)
    assert not (abs(z) > 4.0 and difference > 0.08), (
        f"medians {used * 1e6:.0f} µs (another tenant's key) and {unused * 1e6:.0f} µs"
        f" (no such key), rank test z = {z:.1f}"
    )
