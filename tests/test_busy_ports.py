"""A port already taken: every command that serves says so in one line, exits 2, leaves nothing.

Each test holds a port with a real socket (or a real simulator), runs
``python -m payonce ...`` in a session of its own, and then checks that the
command answered at once, in one line, and that no process of that session is
left (an embedded simulator that outlived its gateway) and nothing listens on
the port the command was given.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import free_port
from tests.support.sim import Sim
from tests.support.waiting import wait_until


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A port some other program listens on (and never answers: nothing accepts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def refused(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        return probe.connect_ex(("127.0.0.1", port)) != 0


def payonce_alone(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m payonce args`` in a new session; fail if any of it outlives it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "payonce", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"`payonce {args[0]}` still ran after 20 s:\n{stderr}")
    try:
        # Any process left of the session: an embedded simulator that outlived it.
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    else:
        pytest.fail(f"a process of `payonce {args[0]}` outlived it:\n{stderr}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def assert_one_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [expected], result.stderr
    assert result.stdout == ""


def serve_args(tmp_path: Path, workers: int, upstream: str) -> list[str]:
    store = "memory://" if workers == 1 else f"sqlite:///{tmp_path}/payonce.db"
    return ["serve", "--store", store, "--workers", str(workers), "--upstream", upstream]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("upstream", ["http://127.0.0.1:9", "sim"])
def test_a_busy_gateway_port_is_one_line_and_exit_2(
    tmp_path: Path, workers: int, upstream: str
) -> None:
    with held_port() as port:
        args = [*serve_args(tmp_path, workers, upstream), "--port", str(port)]
        if upstream == "sim":
            args += ["--sim-port", str(free_port())]
        result = payonce_alone(*args, cwd=tmp_path)
    assert_one_line(
        result, f"payonce: error: --port: cannot listen on 127.0.0.1:{port}: address already in use"
    )


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("holder", ["socket", "simulator"])
def test_a_busy_sim_port_is_one_line_and_exit_2(
    tmp_path: Path, sim: Sim, workers: int, holder: str
) -> None:
    # "simulator": the port is held by another payonce sim (a `make run` left
    # running), which answers /_sim/health like the gateway's own would: the
    # gateway once took it for its own and forwarded to it.
    gateway_port = free_port()
    with contextlib.ExitStack() as stack:
        if holder == "socket":
            sim_port = stack.enter_context(held_port())
        else:
            sim_port = int(sim.url.rsplit(":", 1)[1])
        args = [*serve_args(tmp_path, workers, "sim"), "--port", str(gateway_port)]
        result = payonce_alone(*args, "--sim-port", str(sim_port), cwd=tmp_path)
    assert_one_line(
        result,
        f"payonce: error: --sim-port: cannot listen on 127.0.0.1:{sim_port}:"
        " address already in use",
    )
    assert refused(gateway_port), "the gateway's port was left listening"


def test_a_busy_simulator_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with held_port() as port:
        result = payonce_alone("sim", "--host", "127.0.0.1", "--port", str(port), cwd=tmp_path)
    assert_one_line(
        result, f"payonce: error: --port: cannot listen on 127.0.0.1:{port}: address already in use"
    )


def test_port_0_serves_on_the_port_the_system_chose(tmp_path: Path) -> None:
    # The gateway binds its socket before anything else, so with --port 0 it can
    # say which port it got instead of ":0".
    process = subprocess.Popen(
        [sys.executable, "-m", "payonce", "serve", "--store", "memory://", "--port", "0",
         "--upstream", "http://127.0.0.1:9"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        line = next(line for line in process.stderr if "payonce gateway on" in line)
        port = int(line.split("http://127.0.0.1:", 1)[1].split(" ", 1)[0])
        assert port != 0 and not refused(port), line
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.communicate(timeout=20)


def answers(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_gateway_takes_its_embedded_simulator_with_it(
    workers: int, tmp_path: Path
) -> None:
    """SIGKILL leaves no handler to stop the child: the simulator must notice by itself.

    An orphaned simulator kept --sim-port busy, and the next `make run` failed
    (found in the suite: a later test met 8100 in use)."""
    port, sim_port = free_port(), free_port()
    log = (tmp_path / "serve.log").open("wb")
    gateway = subprocess.Popen(
        [
            *(sys.executable, "-m", "payonce", "serve", "--upstream", "sim"),
            *("--port", str(port), "--sim-port", str(sim_port), "--workers", str(workers)),
            *("--store", f"sqlite:///{tmp_path / 'p.db'}", "--no-otel"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        wait_until(lambda: answers(sim_port, "/_sim/health"), "the simulator to serve", timeout=30)
        wait_until(lambda: answers(port, "/_payonce/health"), "the gateway to serve", timeout=30)
        gateway.kill()
        gateway.wait(timeout=10)
        wait_until(lambda: refused(sim_port), "the simulator to end with its gateway", timeout=15)
    finally:
        gateway.kill()
        log.close()
