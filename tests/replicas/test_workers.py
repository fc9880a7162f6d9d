"""``payonce serve --workers N``: one port, one store, N processes, one supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.replicas.conftest import (
    Gateways,
    alive,
    children,
    command_line,
    post,
    post_many,
    wait_until,
)
from tests.support.processes import free_port, start_payonce
from tests.support.redis import RedisServer
from tests.support.sim import Sim


def _workers(supervisor: int) -> list[int]:
    return [pid for pid in children(supervisor) if "payonce sim " not in command_line(pid)]


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_two_workers_make_one_upstream_call_for_100_concurrent_duplicates(
    start_gateways: Gateways,
    fresh_sim: Sim,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    backend: str,
) -> None:
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis")
        store = server.url
    else:
        store = f"sqlite:///{tmp_path}/workers.db"
    (gateway,) = start_gateways(1, "--workers", "2", store=store)
    assert len(_workers(gateway.popen.pid)) == 2
    answers = await post_many(
        [gateway.url], 100, f"workers-{backend}", headers={"X-Sim-Delay-Ms": "1500"}
    )
    assert {status for status, _, _ in answers} == {200}
    assert [flag for _, flag, _ in answers].count("false") == 1
    assert len({body for _, _, body in answers}) == 1
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)


def test_memory_store_with_workers_is_a_one_line_configuration_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "payonce", "serve", "--workers", "2", "--store", "memory://"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("payonce: error: --workers: memory://")


def test_the_supervisor_restarts_a_dead_worker_and_stops_them_all_on_sigterm(
    start_gateways: Gateways, fresh_sim: Sim, tmp_path: Path
) -> None:
    (gateway,) = start_gateways(1, "--workers", "2", store=f"sqlite:///{tmp_path}/w.db")
    supervisor = gateway.popen.pid
    # Ready means one worker answers; on a loaded machine the other may still be forking.
    wait_until(lambda: len(_workers(supervisor)) == 2, "both workers")
    first, second = _workers(supervisor)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: len(set(_workers(supervisor)) - {first, second}) == 1, "a new worker")
    assert post(gateway.url, "after-restart").status_code == 200
    workers = _workers(supervisor)
    # SIGTERM to the supervisor alone (not its process group): it tells the workers.
    gateway.popen.send_signal(signal.SIGTERM)
    assert gateway.popen.wait(30) == 0, gateway.output()
    wait_until(lambda: not any(alive(pid) for pid in workers), "the workers to exit")
    assert "restarting it" in gateway.output()


def test_upstream_sim_starts_one_simulator_for_all_workers(tmp_path: Path) -> None:
    sim_port = free_port()
    flags = ["--workers", "2", "--upstream", "sim", "--sim-port", str(sim_port)]
    gateway = start_payonce(
        ["serve", *flags, "--store", f"sqlite:///{tmp_path}/sim.db"],
        log_dir=tmp_path,
        ready_path="/_payonce/health",
    )
    try:
        processes = children(gateway.popen.pid)
        simulators = [pid for pid in processes if "payonce sim " in command_line(pid)]
        assert len(simulators) == 1 and len(processes) == 3
        answers = [post(gateway.url, "sim-once", headers={"X-Sim-Delay-Ms": "0"}) for _ in range(4)]
        flags = [answer.headers["idempotent-replayed"] for answer in answers]
        assert flags == ["false", "true", "true", "true"]
        ledger = httpx.get(f"http://127.0.0.1:{sim_port}/_sim/ledger", timeout=10).json()
        assert ledger["billed"] == 1
    finally:
        gateway.stop()
    assert not alive(simulators[0]), "the simulator stops with the gateway"


def test_a_supervisor_stopped_and_continued_goes_on_serving(
    start_gateways: Gateways, fresh_sim: Sim, tmp_path: Path
) -> None:
    """SIGSTOP then SIGCONT (Ctrl-Z and fg, a debugger) is not a request to stop."""
    (gateway,) = start_gateways(1, "--workers", "2", store=f"sqlite:///{tmp_path}/w.db")
    supervisor = gateway.popen.pid
    workers = _workers(supervisor)
    os.kill(supervisor, signal.SIGSTOP)
    time.sleep(1.5)  # past the supervisor's one-second wait for signals
    os.kill(supervisor, signal.SIGCONT)
    time.sleep(1.0)
    assert gateway.popen.poll() is None, gateway.output()
    assert sorted(_workers(supervisor)) == sorted(workers)
    assert post(gateway.url, "after-sigcont").status_code == 200
