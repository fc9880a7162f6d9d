"""Faults with replicas on one Redis, each reported as what the simulator billed.

docs/gateway.md, "Failure modes": a replica killed mid-request and an upstream that drops
the connection after computing are the two ways a key can be billed twice; a
Redis outage answers keyed requests 503 (``closed``) or forwards them unprotected
(``open``), and leaves no key stuck once Redis is back.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.replicas.conftest import AUTH, Gateways, post, wait_until
from tests.support.redis import RedisServer
from tests.support.sim import Sim

pytestmark = pytest.mark.slow

SLOW = {"X-Sim-Delay-Ms": "1500"}


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        yield executor


def _received(sim: Sim, count: int) -> None:
    wait_until(lambda: sim.requests() >= count, f"the simulator to receive {count} request(s)")


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/_payonce/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not exported"
    return float(match.group(1))


def test_a_replica_killed_mid_request_the_retry_runs_on_another_and_is_what_replays(
    start_gateways: Gateways,
    redis: RedisServer,
    fresh_sim: Sim,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    a, b = start_gateways(2, "--lease", "1s", store=redis.url)
    doomed = pool.submit(post, a.url, "killed", headers=SLOW)
    _received(fresh_sim, 1)
    os.kill(a.popen.pid, signal.SIGKILL)
    with pytest.raises(httpx.HTTPError):
        doomed.result()
    # B finds the dead holder's lease, waits for it to lapse (1 s), takes over, runs again.
    retry = post(b.url, "killed", headers=SLOW)
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "false"
    # The simulator finishes A's orphaned generation and bills it: nobody receives it.
    wait_until(lambda: fresh_sim.billed() == 2, "the orphaned generation to be billed")
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (2, 2)
    assert sorted(entry["client_connected"] for entry in ledger["entries"]) == [False, True]
    replay = post(b.url, "killed")
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == retry.content, "the retry's answer is the one kept"


def test_a_frozen_replica_wakes_up_late_and_its_result_is_fenced_off(
    start_gateways: Gateways,
    redis: RedisServer,
    fresh_sim: Sim,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    # SIGSTOP is a replica that stalls (GC pause, VM freeze, a slow disk) past its
    # lease and then carries on: its late complete() must not overwrite the retry's.
    a, b = start_gateways(2, "--lease", "1s", store=redis.url)
    late = pool.submit(post, a.url, "frozen", headers=SLOW)
    _received(fresh_sim, 1)
    os.kill(a.popen.pid, signal.SIGSTOP)
    try:
        retry = post(b.url, "frozen", headers=SLOW)
        assert retry.headers["idempotent-replayed"] == "false"
    finally:
        os.kill(a.popen.pid, signal.SIGCONT)
    original = late.result()
    assert original.status_code == 200, "A still answers its own client"
    assert original.content != retry.content
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (2, 2)
    for replica in (a, b):
        replay = post(replica.url, "frozen")
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.content == retry.content
    assert "not stored: its lease passed to another holder" in a.output()


def test_redis_restarted_mid_flight_closed_refuses_open_forwards_and_no_key_is_stuck(
    start_gateways: Gateways,
    redis: RedisServer,
    fresh_sim: Sim,
    pool: concurrent.futures.ThreadPoolExecutor,
    tmp_path: Path,
) -> None:
    (closed,) = start_gateways(1, store=redis.url)
    calls = tmp_path / "open-calls.jsonl"
    (open_,) = start_gateways(
        1, "--on-store-failure", "open", "--call-log", str(calls), store=redis.url
    )
    in_flight = pool.submit(post, closed.url, "outage-running", headers=SLOW)
    _received(fresh_sim, 1)
    redis.stop()  # SIGKILL: a crash; it had no persistence, so it comes back empty

    refused = post(closed.url, "outage-closed")
    assert refused.status_code == 503
    assert refused.json()["type"].endswith("#store-unavailable")
    assert refused.headers["x-should-retry"] == "true"
    assert httpx.get(closed.url + "/_payonce/health", timeout=10).status_code == 503

    forwarded = [post(open_.url, "outage-open") for _ in range(2)]
    for response in forwarded:
        assert response.status_code == 200
        assert "idempotent-replayed" not in response.headers
        assert response.headers["via"] == "1.1 payonce"
    assert _metric(open_.url, "payonce_unprotected_forwards_total") == 2
    health = httpx.get(open_.url + "/_payonce/health", timeout=10)
    assert (health.status_code, health.json()["store"]) == (200, "unavailable")

    answered = in_flight.result()  # its run finished while Redis was down
    assert answered.status_code == 200
    # 1 run in flight, 0 for the refused key, 2 unprotected runs of one key.
    assert fresh_sim.billed() == 3

    redis.start()  # same port, empty
    again = post(closed.url, "outage-running")
    assert (again.status_code, again.headers["idempotent-replayed"]) == (200, "false")
    assert post(closed.url, "outage-running").headers["idempotent-replayed"] == "true"
    assert post(closed.url, "outage-closed").headers["idempotent-replayed"] == "false"
    assert post(open_.url, "outage-open").headers["idempotent-replayed"] == "false"
    assert post(open_.url, "outage-open").headers["idempotent-replayed"] == "true"
    assert _metric(open_.url, "payonce_unprotected_forwards_total") == 2
    # Redis forgot everything, so the key in flight during the outage ran again.
    assert fresh_sim.billed() == 6

    def bypassed() -> list[dict[str, object]]:
        text = calls.read_text() if calls.exists() else ""
        return [line for line in map(json.loads, text.splitlines()) if line["store_bypassed"]]

    wait_until(lambda: len(bypassed()) == 2, "the call log to be flushed")
    assert {(line["outcome"], line["key"]) for line in bypassed()} == {
        ("passthrough", "outage-open")
    }


def test_a_frozen_redis_comes_back_with_the_answer_written_late(
    start_gateways: Gateways,
    redis: RedisServer,
    fresh_sim: Sim,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    # A Redis that stops answering but keeps its data (SIGSTOP, a network partition):
    # the run that finishes meanwhile cannot store its answer; the gateway retries
    # the write when Redis answers again, so its retry is a replay, billed once.
    (gateway,) = start_gateways(1, store=redis.url + "?timeout=0.5")
    in_flight = pool.submit(post, gateway.url, "frozen-redis", headers=SLOW)
    _received(fresh_sim, 1)
    assert redis.popen is not None
    os.kill(redis.popen.pid, signal.SIGSTOP)
    try:
        answered = in_flight.result()
        assert answered.status_code == 200
        refused = post(gateway.url, "frozen-redis-other")
        assert refused.status_code == 503
        assert refused.json()["type"].endswith("#store-timeout")
    finally:
        os.kill(redis.popen.pid, signal.SIGCONT)
    replay = post(gateway.url, "frozen-redis")
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == answered.content
    assert fresh_sim.billed() == 1


def test_an_upstream_that_drops_the_connection_after_computing_is_billed_again_on_retry(
    start_gateways: Gateways, redis: RedisServer, fresh_sim: Sim
) -> None:
    a, b = start_gateways(2, store=redis.url)
    dropped = post(a.url, "dropped", headers={"X-Sim-Drop": "1"})
    assert dropped.status_code == 502
    assert dropped.headers["x-should-retry"] == "true"
    status = httpx.get(a.url + "/_payonce/requests/dropped", headers=AUTH, timeout=10)
    assert status.status_code == 404, "released: a retry runs again"
    retry = post(b.url, "dropped", headers={"X-Sim-Drop": "0"})
    assert (retry.status_code, retry.headers["idempotent-replayed"]) == (200, "false")
    # The provider billed the generation whose answer never arrived, then the retry.
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (2, 2)
    assert post(a.url, "dropped").content == retry.content
