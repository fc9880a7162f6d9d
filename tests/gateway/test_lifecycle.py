"""Restarts, disconnects, leases shared by two gateway processes, and a killed holder."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import signal
import sqlite3
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim, chat
from tests.support.processes import free_port
from tests.support.waiting import wait_until


def test_completed_keys_replay_after_a_restart(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    port = free_port()
    first_run = start_gateway(port=port)
    original = chat(first_run.url, "restart-1")
    assert first_run.stop() == 0, first_run.output()
    second_run = start_gateway(port=port)
    replay = chat(second_run.url, "restart-1")
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == original.content
    assert fresh_sim.billed() == 1


def test_a_keyed_client_that_leaves_still_gets_its_result_on_retry(gateway, fresh_sim: Sim) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(httpx.ReadTimeout):
        chat(gateway.url, "leaver-1", headers={"X-Sim-Delay-Ms": "1000"}, timeout=0.3)
    status = httpx.get(gateway.url + "/_payonce/requests/leaver-1?wait=5", headers=AUTH).json()
    assert status["state"] == "completed" and status["status_code"] == 200
    retry = chat(gateway.url, "leaver-1")
    assert retry.headers["idempotent-replayed"] == "true"
    ledger = fresh_sim.ledger()
    assert ledger["billed"] == 1
    assert ledger["entries"][0]["client_connected"] is True, "the gateway stayed to read the answer"


@pytest.mark.parametrize(("mode", "connected"), [("cancel", False), ("continue", True)])
def test_unkeyed_disconnect_policy(
    start_gateway: GatewayFactory, fresh_sim: Sim, mode: str, connected: bool
) -> None:
    gateway = start_gateway("--on-disconnect", mode)
    # The gateway has 1.8 s to see the client leave before the generation ends.
    with pytest.raises(httpx.ReadTimeout):
        chat(gateway.url, headers={"X-Sim-Delay-Ms": "2000"}, timeout=0.2)
    wait_until(lambda: fresh_sim.billed(), "the generation's end")
    entries = fresh_sim.ledger()["entries"]
    # A non-streaming provider bills the finished generation either way; what
    # differs is whether anyone was still there to receive it.
    assert len(entries) == 1
    assert entries[0]["client_connected"] is connected


def test_two_gateways_on_one_sqlite_file_share_records_and_leases(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    # A 1 s lease renewed every third of a second keeps a 3 s call owned by A.
    a = start_gateway("--lease", "1s")
    b = start_gateway("--lease", "1s")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, a.url, "shared-1", headers={"X-Sim-Delay-Ms": "3000"})
        wait_until(lambda: fresh_sim.requests(), "A's call upstream")
        time.sleep(1.5)  # past A's first lease: only its renewals keep the call A's
        duplicate = chat(b.url, "shared-1")
        assert duplicate.status_code == 200
        assert duplicate.headers["idempotent-replayed"] == "true"
        assert duplicate.content == first.result().content
    assert fresh_sim.billed() == 1


def test_a_killed_holder_leaves_a_lease_that_lapses_and_the_retry_runs_again(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    a = start_gateway("--lease", "1s")
    b = start_gateway("--lease", "1s")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        doomed = pool.submit(chat, a.url, "killed-1", headers={"X-Sim-Delay-Ms": "1500"})
        wait_until(lambda: fresh_sim.requests(), "A's call upstream")
        a.stop(signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            doomed.result()
    # B waits for the dead holder's lease to lapse, takes over and runs again.
    retry = chat(b.url, "killed-1")
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "false"
    # The simulator finishes A's generation too: the one documented double bill
    # (docs/gateway.md, Failure modes). A's late result can never overwrite B's record.
    wait_until(lambda: fresh_sim.billed() >= 2, "A's generation billed")
    assert fresh_sim.billed() == 2
    assert chat(b.url, "killed-1").content == retry.content


def test_sigterm_lets_a_running_keyed_call_finish_and_store(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    port = free_port()
    a = start_gateway(port=port)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(chat, a.url, "drain-1", headers={"X-Sim-Delay-Ms": "1000"})
        wait_until(lambda: fresh_sim.requests(), "the call upstream")
        a.popen.send_signal(signal.SIGTERM)
        pending.result()  # served or cut; either way the record must be stored
    a.popen.wait(15)
    b = start_gateway(port=port)
    assert chat(b.url, "drain-1").headers["idempotent-replayed"] == "true"
    assert fresh_sim.billed() == 1


def test_a_client_still_waiting_when_shutdown_gives_up_gets_a_problem_not_a_500(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    # uvicorn closes the connections still open 5 s after SIGTERM, cancelling their
    # requests; the keyed runs go on (the drain) and store their answers. They last
    # 8 s from when the simulator has both: 3 s to spare for the signal to land.
    port = free_port()
    calls = tmp_path / "calls.jsonl"
    a = start_gateway("--call-log", str(calls), port=port)
    stream_body = {**CHAT, "stream": True}

    def stream(key: str) -> None:
        sent = {**AUTH, "Idempotency-Key": key, "X-Sim-Token-Ms": "500"}  # 16 tokens: 8 s
        with httpx.stream(
            "POST", a.url + "/v1/chat/completions", json=stream_body, headers=sent, timeout=30
        ) as response:
            assert response.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):  # broken off, not ended cleanly
                for _ in response.iter_raw():
                    pass

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        whole = pool.submit(chat, a.url, "late-1", headers={"X-Sim-Delay-Ms": "8000"})
        streamed = pool.submit(stream, "late-2")
        wait_until(lambda: fresh_sim.requests() == 2, "both calls upstream")
        a.popen.send_signal(signal.SIGTERM)
        answer = whole.result()
        streamed.result()
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"].endswith("#shutting-down")
    assert answer.headers["x-should-retry"] == "true"
    assert a.popen.wait(20) == 0
    assert "Traceback" not in a.output(), a.output()
    # The lines say what the clients got and what their runs did upstream (found by
    # payonce torture: a bill line no call-log line explained).
    lines = {line["key"]: line for line in map(json.loads, calls.read_text().splitlines())}
    billed = {
        entry["provider_request_id"]
        for entry in httpx.get(fresh_sim.url + "/_sim/ledger?entries=1").json()["entries"]
    }
    assert lines["late-1"]["status"] == 503
    assert {
        lines["late-1"]["upstream_request_id"],
        lines["late-2"]["upstream_request_id"],
    } == billed
    b = start_gateway(port=port)
    assert chat(b.url, "late-1").headers["idempotent-replayed"] == "true"
    replay = httpx.post(
        b.url + "/v1/chat/completions",
        json=stream_body,
        headers={**AUTH, "Idempotency-Key": "late-2"},
        timeout=30,
    )
    assert replay.headers["idempotent-replayed"] == "true" and b"[DONE]" in replay.content
    assert fresh_sim.billed() == 2


def _record(db: Path, key: str) -> tuple[str, float, float] | None:
    """``key``'s state, claim time and lease end, as the store holds them (None: no claim yet)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            "SELECT state, created_at, lease_expires_at FROM payonce_records WHERE key = ?",
            (key,),
        ).fetchone()
    return (str(row[0]), float(row[1]), float(row[2])) if row else None


def test_each_lease_is_renewed_on_its_own_schedule(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    # Two keyed calls started 0.6 s apart under a 3 s lease: each is renewed a third
    # of a lease (1 s) after its own claim or last renewal, never sooner. Renewing
    # every run at one tick every 1 s (as before) put their lease ends at the same
    # instant (with thousands of calls in flight, a burst of thousands of renewals
    # at once), so one of two calls claimed 0.6 s apart was renewed 0.6 s or less
    # after its claim. A lease ends a lease after the instant it was taken
    # or renewed, so the ends the store held while the calls ran say when each was;
    # a busy machine can make a renewal later, never sooner.
    gateway = start_gateway("--lease", "3s")
    db = tmp_path / "payonce.db"
    slow = {"X-Sim-Delay-Ms": "4000"}
    keys = ("own-schedule-1", "own-schedule-2")
    ends: dict[str, set[float]] = {key: set() for key in keys}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, gateway.url, keys[0], headers=slow)
        time.sleep(0.6)
        second = pool.submit(chat, gateway.url, keys[1], headers=slow)
        while not (first.done() and second.done()):
            for key in keys:
                record = _record(db, key)
                if record is not None and record[0] == "in_progress":
                    ends[key] |= {record[1] + 3, record[2]}  # the claim's end, the latest
            time.sleep(0.02)
        assert first.result().status_code == second.result().status_code == 200
    for key, seen in ends.items():
        assert len(seen) > 1, f"{key}: never seen renewed ({sorted(seen)})"
        times = sorted(seen)
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        # 1 s, less how late the store read its clock for the renewal before (a few
        # ms): 0.2 s allowed. One tick for all renewed one of these two 0.6 s or
        # less after its claim.
        assert min(gaps) > 0.8, f"{key} renewed {min(gaps):.2f} s after the last: {gaps}"
    assert fresh_sim.billed() == 2


def test_a_stopping_gateway_renews_the_leases_of_the_calls_it_drains(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    # After SIGTERM the server waits 5 s for open requests, then the drain waits up
    # to a lease for the keyed runs. A 6 s lease is renewed every 2 s; were renewals
    # to stop when the drain begins, it would lapse mid-drain, while A still runs
    # the call, and B would report it abandoned (and a retry there would run it again).
    # So once A says its drain began, the lease must be renewed again while the call
    # runs: it ends 13 s after its claim, the drain begins about 5 s after it.
    a = start_gateway("--lease", "6s")
    b = start_gateway("--lease", "6s")
    db = tmp_path / "payonce.db"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(chat, a.url, "drained-1", headers={"X-Sim-Delay-Ms": "13000"})
        wait_until(lambda: _record(db, "drained-1"), "the claim")
        a.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: "for 1 keyed upstream call" in a.output(), "the drain")
        draining = _record(db, "drained-1")
        assert draining is not None and draining[0] == "in_progress", draining
        record: tuple[str, float, float] | None = draining

        def renewed_or_ended() -> bool:
            nonlocal record
            record = _record(db, "drained-1")
            return record is None or record[0] != "in_progress" or record[2] > draining[2]

        wait_until(renewed_or_ended, "a renewal or the call's end")
        assert record is not None and record[0] == "in_progress", (
            f"the call ended with no renewal in the drain: {record}"
        )
        status = httpx.get(b.url + "/_payonce/requests/drained-1", headers=AUTH, timeout=5)
        assert status.json()["state"] == "in_progress", status.json()
    assert a.popen.wait(20) == 0
    deadline = time.monotonic() + 5  # the provider finishes the generation: not the next test's
    while fresh_sim.billed() == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
