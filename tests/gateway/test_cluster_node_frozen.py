"""A frozen Redis Cluster node fails what it holds within ``?timeout``, and health says so.

redis-py's cluster client retries a command that timed out on a node, so before
issue 29 a keyed request whose record lives on a node that stopped answering
(SIGSTOP: a VM paused, a node swapping) got its 503 after twice ``?timeout``,
and ``/_payonce/health`` pinged one node, answered ``ok`` throughout, and kept
the gateway in its load balancer while a third of the keys were refused.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator

import httpx2
import pytest

from tests.support.processes import Process, running
from tests.support.redis import RedisCluster, running_cluster
from tests.support.sim import CHAT_BODY

TIMEOUT = 2.0  # the store URL's ?timeout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def gateway(cluster: RedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    store = f"{cluster.url}?timeout={TIMEOUT:g}"
    args = ["serve", "--upstream", "sim", "--store", store]
    with running(args, log_dir=tmp_path_factory.mktemp("gw"), ready_path="/_payonce/health") as gw:
        yield gw


def _timed(call: httpx2.Request, client: httpx2.Client) -> tuple[httpx2.Response, float]:
    started = time.monotonic()
    response = client.send(call)
    return response, time.monotonic() - started


@pytest.mark.slow
def test_a_frozen_node_fails_its_keys_once_within_the_timeout_and_health_says_so(
    cluster: RedisCluster, gateway: Process
) -> None:
    frozen = cluster.nodes[1]
    assert frozen.popen is not None
    with httpx2.Client(timeout=30) as client:
        assert client.get(gateway.url + "/_payonce/health").status_code == 200
        os.kill(frozen.popen.pid, signal.SIGSTOP)
        try:
            health, took = _timed(
                client.build_request("GET", gateway.url + "/_payonce/health"), client
            )
            assert health.status_code == 503, health.text
            assert health.headers["content-type"] == "application/problem+json"
            # Once the timeout, not twice: the bound catches only the retry's whole second wait.
            assert took < 2 * TIMEOUT, took
            refused = 0
            # Twelve keys one after another: some live on the frozen node (each key
            # is on a random one of three), the others must not notice it.
            for _ in range(12):
                request = client.build_request(
                    "POST",
                    gateway.url + "/v1/chat/completions",
                    json=CHAT_BODY,
                    # No latency draw (the built-in simulator's p99 is 10 s).
                    headers={"Idempotency-Key": str(uuid.uuid4()), "X-Sim-Delay-Ms": "0"},
                )
                response, took = _timed(request, client)
                assert response.status_code in (200, 503), response.text
                if response.status_code == 503:
                    refused += 1
                    assert response.headers["x-should-retry"] == "true"
                    assert took < 2 * TIMEOUT, took
            assert 0 < refused < 12
        finally:
            os.kill(frozen.popen.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while client.get(gateway.url + "/_payonce/health").status_code != 200:
            assert time.monotonic() < deadline, "health never came back"
            time.sleep(0.2)
