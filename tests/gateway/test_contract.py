"""Every row of the outcome table in docs/gateway.md ("The contract"), against a real gateway and simulator."""

from __future__ import annotations

import concurrent.futures
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim, chat, module_gateway
from tests.support.processes import Process


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One default gateway for the module (27 tests; 1.5-3 s a start saved each): every
    test uses keys no other test does, counts only the simulator's ledger (emptied by
    ``fresh_sim``) and has its answers before it returns. Tests that need flags or a
    store of their own start their own gateway with ``start_gateway``."""
    yield from module_gateway(sim, tmp_path_factory)


def assert_problem(
    response: httpx.Response, status: int, should_retry: str | None
) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers.get("x-should-retry") == should_retry
    problem = response.json()
    assert problem["status"] == status and problem["title"] and problem["detail"]
    return problem


def test_new_key_forwards_once_and_a_completed_duplicate_replays(
    gateway: Process, fresh_sim: Sim
) -> None:
    first = chat(gateway.url, "order-1")
    assert first.status_code == 200
    assert first.headers["idempotent-replayed"] == "false"
    second = chat(gateway.url, "order-1")
    assert second.status_code == 200
    assert second.headers["idempotent-replayed"] == "true"
    assert second.content == first.content
    assert second.headers["x-request-id"] == first.headers["x-request-id"]
    assert second.headers["content-type"] == first.headers["content-type"]
    assert fresh_sim.billed() == 1
    assert fresh_sim.requests() == 1


def test_json_key_order_does_not_change_the_fingerprint(gateway: Process, fresh_sim: Sim) -> None:
    first = chat(gateway.url, "order-2")
    reordered = json.loads(json.dumps(dict(reversed(list(CHAT.items())))))
    second = chat(gateway.url, "order-2", body=reordered)
    assert second.headers["idempotent-replayed"] == "true"
    assert second.content == first.content
    assert fresh_sim.billed() == 1


def test_a_duplicate_in_progress_waits_and_gets_the_same_result(
    gateway: Process, fresh_sim: Sim
) -> None:
    slow = {"X-Sim-Delay-Ms": "800"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, gateway.url, "order-3", headers=slow)
        second = pool.submit(chat, gateway.url, "order-3", headers=slow)
        responses = [first.result(), second.result()]
    assert {r.status_code for r in responses} == {200}
    assert responses[0].content == responses[1].content
    assert sorted(r.headers["idempotent-replayed"] for r in responses) == ["false", "true"]
    assert fresh_sim.billed() == 1


def test_past_the_wait_timeout_a_duplicate_gets_409_with_retry_after(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--wait-timeout", "300ms")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, gateway.url, "order-4", headers={"X-Sim-Delay-Ms": "2000"})
        # Wait until the first request holds the key, then send the duplicate.
        for _ in range(100):
            if (
                httpx.get(gateway.url + "/_payonce/requests/order-4", headers=AUTH).status_code
                == 200
            ):
                break
        duplicate = chat(gateway.url, "order-4")
        assert_problem(duplicate, 409, "true")
        assert int(duplicate.headers["retry-after"]) >= 1
        assert first.result().status_code == 200
    assert chat(gateway.url, "order-4").headers["idempotent-replayed"] == "true"
    assert fresh_sim.billed() == 1


def test_same_key_with_another_body_is_422_and_leaves_the_original(
    gateway: Process, fresh_sim: Sim
) -> None:
    original = chat(gateway.url, "order-5")
    other = chat(gateway.url, "order-5", body={**CHAT, "max_tokens": 17})
    assert_problem(other, 422, "false")
    replay = chat(gateway.url, "order-5")
    assert replay.headers["idempotent-replayed"] == "true" and replay.content == original.content
    assert fresh_sim.billed() == 1


@pytest.mark.parametrize(
    "bad_key",
    [
        "x" * 256,
        "has space",
        '"unterminated',
        '"bad\\escape"',
        '"quoted"trailing',
        '""',
        "tab\tinside",
    ],
)
def test_malformed_keys_are_400_and_run_nothing(
    gateway: Process, fresh_sim: Sim, bad_key: str
) -> None:
    response = chat(gateway.url, bad_key)
    assert_problem(response, 400, "false")
    assert fresh_sim.requests() == 0


def test_non_ascii_and_conflicting_keys_are_400(gateway: Process, fresh_sim: Sim) -> None:
    raw = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=CHAT,
        headers=[("Idempotency-Key", "clé".encode())],
    )
    assert_problem(raw, 400, "false")
    both = chat(gateway.url, "a", headers={"X-Idempotency-Key": "b"})
    assert_problem(both, 400, "false")
    assert fresh_sim.requests() == 0


def test_quoted_and_bare_forms_are_one_key(gateway: Process, fresh_sim: Sim) -> None:
    chat(gateway.url, "order-6")
    quoted = chat(gateway.url, '"order-6"')
    assert quoted.headers["idempotent-replayed"] == "true"
    alias = chat(gateway.url, None, headers={"X-Idempotency-Key": "order-6"})
    assert alias.headers["idempotent-replayed"] == "true"
    assert fresh_sim.billed() == 1


def test_required_key_missing_is_400(start_gateway: GatewayFactory, fresh_sim: Sim) -> None:
    gateway = start_gateway("--require-key")
    problem = assert_problem(chat(gateway.url), 400, "false")
    assert "Idempotency-Key" in str(problem["detail"])
    assert chat(gateway.url, "order-7").status_code == 200
    assert fresh_sim.requests() == 1


def test_no_key_is_a_plain_proxy_and_stores_nothing(gateway: Process, fresh_sim: Sim) -> None:
    first, second = chat(gateway.url), chat(gateway.url)
    assert first.status_code == second.status_code == 200
    assert "idempotent-replayed" not in first.headers
    assert first.json()["id"] != second.json()["id"]
    assert fresh_sim.billed() == 2


@pytest.mark.parametrize("status", ["408", "409", "429", "500", "502", "503", "504"])
def test_upstream_transient_failures_are_returned_and_released(
    gateway: Process, fresh_sim: Sim, status: str
) -> None:
    failed = chat(gateway.url, f"order-8-{status}", headers={"X-Sim-Fail": status})
    assert failed.status_code == int(status)
    assert failed.headers["idempotent-replayed"] == "false"
    retry = chat(gateway.url, f"order-8-{status}")
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "false"
    assert fresh_sim.requests() == 2
    assert fresh_sim.billed() == 1


@pytest.mark.parametrize("status", ["400", "401", "404", "422"])
def test_other_upstream_errors_are_stored_and_replayed(
    gateway: Process, fresh_sim: Sim, status: str
) -> None:
    failed = chat(gateway.url, f"order-9-{status}", headers={"X-Sim-Fail": status})
    assert failed.status_code == int(status)
    replay = chat(gateway.url, f"order-9-{status}")
    assert replay.status_code == int(status)
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == failed.content
    assert fresh_sim.requests() == 1


def test_connection_lost_after_compute_is_502_and_the_retry_runs_again(
    gateway: Process, fresh_sim: Sim
) -> None:
    dropped = chat(gateway.url, "order-10", headers={"X-Sim-Drop": "1"})
    assert_problem(dropped, 502, "true")
    retry = chat(gateway.url, "order-10")
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "false"
    # The one case a second bill is unavoidable: the upstream finished, billed,
    # and the answer was lost on the way. Without a response there is nothing to store.
    assert fresh_sim.billed() == 2


def test_body_over_the_limit_is_413(start_gateway: GatewayFactory, fresh_sim: Sim) -> None:
    gateway = start_gateway("--max-body", "1KiB")
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    assert_problem(chat(gateway.url, "order-11", body=big), 413, "false")

    def chunks():  # no content-length: the limit is enforced while reading
        yield b"{" + b" " * 2000 + b"}"

    streamed = httpx.post(gateway.url + "/v1/chat/completions", content=chunks(), headers=AUTH)
    assert_problem(streamed, 413, "false")
    assert fresh_sim.requests() == 0


def test_store_unavailable_with_a_key_is_503_and_nothing_runs(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    db = tmp_path / "locked.db"
    gateway = start_gateway(store=f"sqlite:///{db}?timeout=0.2")
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        response = chat(gateway.url, "order-12")
        assert_problem(response, 503, "true")
        assert fresh_sim.requests() == 0
        assert chat(gateway.url).status_code == 200, "unkeyed traffic does not need the store"
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert chat(gateway.url, "order-12").status_code == 200


def test_unknown_gateway_paths_and_methods_are_problems(gateway: Process) -> None:
    assert_problem(httpx.get(gateway.url + "/_payonce/nope"), 404, "false")
    assert_problem(httpx.post(gateway.url + "/_payonce/health"), 405, "false")
