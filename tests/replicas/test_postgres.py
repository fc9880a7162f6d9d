"""Gateways on PostgreSQL: replicas sharing it, and the server's faults, with real processes.

Each test has a server of its own (tests/support/postgres.py), so it may be
restarted, its connections killed or its rows locked from psql.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.replicas.conftest import AUTH, CHAT, Gateways, post, wait_until
from tests.support.postgres import Postgres, running_postgres
from tests.support.processes import start_payonce
from tests.support.sim import Sim

pytestmark = pytest.mark.slow

SLOW = {"X-Sim-Delay-Ms": "3000"}


@pytest.fixture
def pg() -> Iterator[Postgres]:
    with running_postgres() as server:
        yield server


def test_replicas_share_records_and_follow_each_others_streams(
    start_gateways: Gateways, pg: Postgres, fresh_sim: Sim
) -> None:
    a, b = start_gateways(2, store=pg.url)
    first = post(a.url, "pg-replicas")
    again = post(b.url, "pg-replicas")
    assert first.status_code == again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    # The status endpoint of either replica reads the record from PostgreSQL.
    status = httpx.get(b.url + "/_payonce/requests/pg-replicas", headers=AUTH, timeout=10)
    assert status.status_code == 200
    assert status.json()["state"] == "completed"
    assert status.json()["replays"] >= 0
    hidden = httpx.get(b.url + "/_payonce/requests/pg-replicas", timeout=10)
    assert hidden.status_code in (401, 404), "another tenant's record is not shown"
    # A stream recorded by A, followed live from B while it runs.
    body = {**CHAT, "stream": True}
    headers = {**AUTH, "Idempotency-Key": "pg-stream", "X-Sim-Delay-Ms": "0"}
    headers["X-Sim-Token-Ms"] = "40"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            httpx.post, a.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
        )
        wait_until(lambda: fresh_sim.requests() >= 2, "A to start the stream")
        followed = httpx.post(
            b.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
        )
        original = running.result(timeout=30)
    assert followed.status_code == 200
    assert followed.headers["idempotent-replayed"] in ("true", "joined")
    assert followed.text == original.text
    assert fresh_sim.billed() == 2


def test_a_restart_of_postgres_mid_call_is_answered_and_replayed_once(
    start_gateways: Gateways, pg: Postgres, fresh_sim: Sim
) -> None:
    (gateway,) = start_gateways(1, store=pg.url)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(post, gateway.url, "pg-restart", headers=SLOW)
        wait_until(lambda: fresh_sim.requests() >= 1, "the call to reach the upstream")
        pg.stop("fast")
        time.sleep(0.5)
        pg.start()
        answer = call.result(timeout=60)
    assert answer.status_code == 200
    # The completion waited for the server to come back; the retry is a replay.
    wait_until(
        lambda: post(gateway.url, "pg-restart").headers.get("idempotent-replayed") == "true",
        "the answer stored once the server was back",
        timeout=20,
    )
    assert fresh_sim.billed() == 1
    health = httpx.get(gateway.url + "/_payonce/health", timeout=10)
    assert health.status_code == 200


def test_killed_connections_are_replaced_without_a_failed_request(
    start_gateways: Gateways, pg: Postgres, fresh_sim: Sim
) -> None:
    (gateway,) = start_gateways(1, store=pg.url)
    assert post(gateway.url, "pg-before").status_code == 200
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'payonce'"
    )
    statuses = [post(gateway.url, f"pg-after-{i}").status_code for i in range(5)]
    # A call may meet a dead pooled connection (503, retried by any client);
    # the pool replaces it and the rest are served.
    assert statuses.count(200) >= 4, statuses
    assert statuses[-1] == 200


def test_a_row_locked_from_psql_is_a_503_problem_not_a_hang(
    start_gateways: Gateways, pg: Postgres, fresh_sim: Sim
) -> None:
    store = pg.url + "?timeout=1"
    (gateway,) = start_gateways(1, "--lease", "3s", store=store)
    assert post(gateway.url, "pg-locked").status_code == 200
    locker = pg.psql_background(
        "BEGIN; SELECT * FROM payonce_records WHERE key = 'pg-locked' FOR UPDATE;"
        " SELECT pg_sleep(60);"
    )
    try:
        time.sleep(1)
        # A replay reads past a row lock; a new key's claim is not blocked either.
        assert post(gateway.url, "pg-locked").status_code == 200
        assert post(gateway.url, "pg-other").status_code == 200
        # A purge or renewal of the locked row would wait: the gateway does not.
        started = time.monotonic()
        health = httpx.get(gateway.url + "/_payonce/health", timeout=30)
        assert time.monotonic() - started < 10
        assert health.status_code == 200
    finally:
        locker.kill()
        locker.wait()


def test_postgres_down_at_start_up_is_503_until_it_is_back(
    pg: Postgres, fresh_sim: Sim, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pg.stop("fast")
    gateway = start_payonce(
        ["serve", "--upstream", fresh_sim.url, "--store", pg.url + "?timeout=1"],
        log_dir=tmp_path,
        ready_path="/_payonce/openapi.json",  # health says 503 while the store is down
    )
    request.addfinalizer(gateway.stop)
    refused = post(gateway.url, "pg-down")
    assert refused.status_code == 503
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert "secret" not in refused.text and "payonce_records" not in refused.text
    health = httpx.get(gateway.url + "/_payonce/health", timeout=10)
    assert health.status_code == 503
    pg.start()
    wait_until(
        lambda: post(gateway.url, "pg-down").status_code == 200,
        "served once it is back",
        timeout=30,
    )


def test_no_migrate_refuses_to_start_on_an_empty_database_in_one_line(
    pg: Postgres, fresh_sim: Sim, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    serve = ["serve", "--upstream", fresh_sim.url, "--store", pg.url, "--no-migrate"]
    refused = subprocess.run(
        [sys.executable, "-m", "payonce", *serve, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "run `payonce migrate --store URL`" in refused.stderr
    migrated = subprocess.run(
        [sys.executable, "-m", "payonce", "migrate", "--store", pg.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stderr
    gateway = start_payonce(serve, log_dir=tmp_path, ready_path="/_payonce/health")
    request.addfinalizer(gateway.stop)
    assert post(gateway.url, "pg-migrated").status_code == 200
