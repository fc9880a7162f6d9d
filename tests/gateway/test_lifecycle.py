"""Restarts, disconnects, leases shared by two gateway processes, and a killed holder."""

from __future__ import annotations

import concurrent.futures
import signal
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.gateway.conftest import AUTH, GatewayFactory, Sim, chat
from tests.support.processes import free_port


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
    with pytest.raises(httpx.ReadTimeout):
        chat(gateway.url, headers={"X-Sim-Delay-Ms": "700"}, timeout=0.2)
    time.sleep(1.2)
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
        time.sleep(1.5)
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
        time.sleep(0.3)
        a.stop(signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            doomed.result()
    # B waits for the dead holder's lease to lapse, takes over and runs again.
    retry = chat(b.url, "killed-1")
    assert retry.status_code == 200 and retry.headers["idempotent-replayed"] == "false"
    time.sleep(1.5)
    # The simulator finished A's generation too: the one documented double bill
    # (docs/gateway.md, Failure modes). A's late result can never overwrite B's record.
    assert fresh_sim.billed() == 2
    assert chat(b.url, "killed-1").content == retry.content


def test_sigterm_lets_a_running_keyed_call_finish_and_store(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    port = free_port()
    a = start_gateway(port=port)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(chat, a.url, "drain-1", headers={"X-Sim-Delay-Ms": "1000"})
        time.sleep(0.3)
        a.popen.send_signal(signal.SIGTERM)
        pending.result()  # served or cut; either way the record must be stored
    a.popen.wait(15)
    b = start_gateway(port=port)
    assert chat(b.url, "drain-1").headers["idempotent-replayed"] == "true"
    assert fresh_sim.billed() == 1
