"""The gateway's own endpoints: health, request status with long-poll, stored response."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.gateway.conftest import AUTH, GatewayFactory, Sim, chat, module_gateway
from tests.support.processes import Process
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One default gateway for the module: every test uses keys no other test does,
    counts only the simulator's ledger (emptied by ``fresh_sim``) and has its answers
    before it returns. The restart test starts its own gateways with ``start_gateway``."""
    yield from module_gateway(sim, tmp_path_factory)


def test_health(gateway: Process) -> None:
    response = httpx.get(gateway.url + "/_payonce/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "store": "ok"}


def test_status_document_of_a_completed_request(gateway: Process, fresh_sim: Sim) -> None:
    chat(gateway.url, "status-1")
    chat(gateway.url, "status-1")
    doc = httpx.get(gateway.url + "/_payonce/requests/status-1", headers=AUTH).json()
    assert set(doc) == {
        "key",
        "state",
        "status_code",
        "created_at",
        "completed_at",
        "replays",
        "usage",
        "cost_usd",
        "upstream_request_id",
        "events",
    }
    assert doc["events"] is None, "not a stream"
    assert doc["key"] == "status-1"
    assert doc["state"] == "completed"
    assert doc["status_code"] == 200
    assert doc["replays"] == 1
    entry = fresh_sim.ledger()["entries"][0]
    assert doc["usage"]["input_tokens"] == entry["input_tokens"]
    assert doc["usage"]["output_tokens"] == entry["output_tokens"]
    assert doc["cost_usd"] == pytest.approx(entry["cost_usd"]), "the sim bills list prices"
    created = datetime.fromisoformat(doc["created_at"])
    completed = datetime.fromisoformat(doc["completed_at"])
    assert created <= completed


def test_long_poll_returns_when_the_request_completes(gateway: Process, fresh_sim: Sim) -> None:
    status = gateway.url + "/_payonce/requests/status-2"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # A 2 s call: the status is asked for as soon as the call is upstream.
        pending = pool.submit(chat, gateway.url, "status-2", headers={"X-Sim-Delay-Ms": "2000"})
        wait_until(lambda: fresh_sim.requests(), "the call upstream")
        running = httpx.get(status, headers=AUTH).json()
        assert running["state"] == "in_progress" and running["status_code"] is None
        not_yet = httpx.get(status + "/response", headers=AUTH)
        assert not_yet.status_code == 409 and not_yet.headers["retry-after"]
        started = time.monotonic()
        done = httpx.get(status + "?wait=20", headers=AUTH, timeout=30)
        # Back when the call completed (2 s), not when the wait ran out (20 s).
        assert time.monotonic() - started < 10
        assert done.json()["state"] == "completed"
        original = pending.result()
    stored = httpx.get(gateway.url + "/_payonce/requests/status-2/response", headers=AUTH)
    assert stored.status_code == 200
    assert stored.content == original.content
    assert stored.headers["idempotent-replayed"] == "true"
    assert stored.headers["x-request-id"] == original.headers["x-request-id"]


def test_unknown_and_released_keys_are_404(gateway: Process, fresh_sim: Sim) -> None:
    assert httpx.get(gateway.url + "/_payonce/requests/never-sent", headers=AUTH).status_code == 404
    chat(gateway.url, "status-3", headers={"X-Sim-Fail": "503"})
    released = httpx.get(gateway.url + "/_payonce/requests/status-3", headers=AUTH)
    assert released.status_code == 404
    assert released.headers["content-type"] == "application/problem+json"


def test_keys_with_reserved_characters_round_trip_through_the_path(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = "order/42?x=1 #a"
    chat(gateway.url, f'"{key}"')
    path_key = "order%2F42%3Fx%3D1%20%23a"
    doc = httpx.get(f"{gateway.url}/_payonce/requests/{path_key}", headers=AUTH).json()
    assert doc["key"] == key


def test_bad_wait_values_are_400(gateway: Process) -> None:
    for bad in ("abc", "-1", "301", "nan"):
        response = httpx.get(gateway.url + f"/_payonce/requests/x?wait={bad}", headers=AUTH)
        assert response.status_code == 400, bad
        assert response.headers["content-type"] == "application/problem+json"


def test_a_dead_holders_record_is_abandoned_once_its_lease_lapses(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    # Issue 12, item 1: SIGKILL the gateway mid-call and start it again on the same
    # SQLite file. Before the fix the record said "in_progress" until its 24 h TTL.
    store = f"sqlite:///{tmp_path}/restarted.db"
    first = start_gateway("--lease", "3s", store=store)
    status = "/_payonce/requests/dead-holder"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        doomed = pool.submit(chat, first.url, "dead-holder", headers={"X-Sim-Delay-Ms": "5000"})
        deadline = time.monotonic() + 20
        while fresh_sim.requests() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(first.popen.pid, signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            doomed.result()
    second = start_gateway("--lease", "3s", store=store)

    # Asked while the dead holder's lease still runs: the long-poll returns when
    # the lease lapses (that is the change), not at once with nothing new.
    lapsed = httpx.get(second.url + status + "?wait=20", headers=AUTH, timeout=30)
    assert lapsed.status_code == 200
    assert lapsed.json()["state"] == "abandoned"
    assert lapsed.json()["status_code"] is None
    # Nothing will change by itself any more: a long-poll answers at once.
    again = httpx.get(second.url + status + "?wait=20", headers=AUTH, timeout=30)
    assert again.json()["state"] == "abandoned"
    response = httpx.get(second.url + status + "/response", headers=AUTH, timeout=30)
    assert response.status_code == 404
    assert response.json()["type"].endswith("#abandoned")
    assert response.headers["x-should-retry"] == "false"

    # What "abandoned" promises: re-sending with the key runs it again.
    retry = chat(second.url, "dead-holder")
    assert (retry.status_code, retry.headers["idempotent-replayed"]) == (200, "false")
    done = httpx.get(second.url + status, headers=AUTH, timeout=30).json()
    assert done["state"] == "completed"
