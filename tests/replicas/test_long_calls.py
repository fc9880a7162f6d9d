"""A call that runs longer than ``--ttl`` keeps its key: one run, one bill, one answer.

Issue 29, defect 3. A record's expiry was fixed at its claim (first use plus
``--ttl``) and the purge deleted expired records whatever their state, so a
call still running past its ttl lost its record: a duplicate on another gateway
claimed the key and ran the call a second time (billed twice), and the first
run's answer was not stored (its ``complete`` found no record), so a retry
after both ran it a third time. The reproduction: two gateways on one store,
``--ttl 3s --lease 1s --upstream-timeout 10s``, a 7 s call, its duplicate sent
to the other gateway at 4.5 s.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.replicas.conftest import Gateways, post
from tests.support.redis import RedisServer
from tests.support.sim import Sim

pytestmark = pytest.mark.slow

FLAGS = ("--ttl", "3s", "--lease", "1s", "--upstream-timeout", "10s")
LONG = {"X-Sim-Delay-Ms": "7000"}  # the call runs 7 s: more than twice --ttl
DUPLICATE_AFTER = 4.5  # seconds after the first call: past --ttl, before the answer


def _store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis")
        return server.url
    return f"sqlite:///{tmp_path / 'shared.db'}"


def _first_and_late_duplicate(
    first_url: str, duplicate_url: str, key: str
) -> tuple[httpx.Response, httpx.Response]:
    """The long call through ``first_url``, its duplicate through ``duplicate_url`` later."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        first = pool.submit(post, first_url, key, headers=LONG, timeout=30)
        time.sleep(max(0.0, started + DUPLICATE_AFTER - time.monotonic()))
        assert not first.done(), "the first call must still be running"
        duplicate = pool.submit(post, duplicate_url, key, headers=LONG, timeout=30)
        return first.result(timeout=30), duplicate.result(timeout=30)


def _assert_one_run(first: httpx.Response, duplicate: httpx.Response, fresh_sim: Sim) -> None:
    assert (first.status_code, duplicate.status_code) == (200, 200)
    assert first.headers["idempotent-replayed"] == "false"
    assert duplicate.headers["idempotent-replayed"] == "true", "the duplicate ran it again"
    assert duplicate.content == first.content, "both clients get the same answer"
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_duplicate_on_another_gateway_after_ttl_waits_for_the_running_call(
    backend: str,
    start_gateways: Gateways,
    fresh_sim: Sim,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    a, b = start_gateways(2, *FLAGS, store=_store(backend, tmp_path, request))
    key = f"long-call-two-gateways-{backend}"
    first, duplicate = _first_and_late_duplicate(a.url, b.url, key)
    _assert_one_run(first, duplicate, fresh_sim)
    # The answer is kept for --ttl after it was stored, not after first use.
    again = post(b.url, key, headers=LONG)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert fresh_sim.billed() == 1


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_long_call_on_one_gateway_is_stored_and_replayed_after_ttl(
    backend: str,
    start_gateways: Gateways,
    fresh_sim: Sim,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    (gateway,) = start_gateways(1, *FLAGS, store=_store(backend, tmp_path, request))
    key = f"long-call-one-gateway-{backend}"
    first, duplicate = _first_and_late_duplicate(gateway.url, gateway.url, key)
    _assert_one_run(first, duplicate, fresh_sim)
    # Its answer was stored although the call outlived --ttl: a retry replays it.
    retry = post(gateway.url, key, headers=LONG)
    assert retry.status_code == 200
    assert retry.headers["idempotent-replayed"] == "true", "the answer was not stored"
    assert retry.content == first.content
    assert fresh_sim.billed() == 1
