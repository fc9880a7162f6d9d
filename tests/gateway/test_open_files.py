"""Thousands of calls in flight need thousands of descriptors (issue 19, workload 4).

Each keyed call in flight holds two sockets in the gateway (the client's and the
upstream's) and one in the simulator. Started under a shell's usual soft limit
(1024; 256 here, to keep the test small), the gateway answered 502 or reset the
connection once the limit was reached, although the hard limit allowed far more.
Both processes now raise their soft limit to the hard one at startup, as nginx
(``worker_rlimit_nofile``) and Go programs do.
"""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.processes import Process, _wait_ready, free_port

SOFT = 256
CALLS = 300  # more sockets than SOFT allows: 600 in the gateway, 300 in the sim
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def _low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, hard))


def _start(args: list[str], ready: str, log_dir: Path, *, low_limit: bool) -> Process:
    port = free_port()
    log = log_dir / f"{args[0]}-{port}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [sys.executable, "-m", "payonce", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_low_soft_limit if low_limit else None,
        )
    process = Process(popen=popen, url=f"http://127.0.0.1:{port}", log=log)
    _wait_ready(process, ready, timeout=20)
    return process


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, Process]]:
    """A simulator and a gateway in front of it, both started with a soft limit of 256."""
    folder = tmp_path_factory.mktemp("open-files")
    sim = _start(["sim", "--latency", "fixed:0"], "/_sim/health", folder, low_limit=True)
    try:
        store = f"sqlite:///{folder}/payonce.db"
        args = ["serve", "--upstream", sim.url, "--store", store, "--no-otel"]
        gateway = _start(args, "/_payonce/health", folder, low_limit=True)
        try:
            yield sim, gateway
        finally:
            gateway.stop()
    finally:
        sim.stop()


async def _concurrent_calls(url: str, count: int) -> Counter[object]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> object:
            headers = {
                "Authorization": "Bearer sk-open-files",
                "Idempotency-Key": f"fd-{uuid.uuid4()}",
                "X-Sim-Delay-Ms": "1500",  # long enough for all of them to be in flight
            }
            try:
                async with session.post(
                    f"{url}/v1/chat/completions", json=BODY, headers=headers
                ) as r:
                    await r.read()
                    return r.status
            except aiohttp.ClientError as exc:
                return type(exc).__name__

        return Counter(await asyncio.gather(*(one() for _ in range(count))))


async def test_the_simulator_holds_more_calls_than_its_inherited_soft_limit(
    processes: tuple[Process, Process],
) -> None:
    sim, _ = processes
    assert await _concurrent_calls(sim.url, CALLS) == Counter({200: CALLS})


async def test_the_gateway_holds_more_calls_than_its_inherited_soft_limit(
    processes: tuple[Process, Process],
) -> None:
    _, gateway = processes
    assert await _concurrent_calls(gateway.url, CALLS) == Counter({200: CALLS})


def _listen_backlog(url: str) -> int:
    """The accept queue's size of the socket listening at ``url`` (``ss``: Send-Q)."""
    port = url.rsplit(":", 1)[1]
    done = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[2])


def test_a_burst_of_connections_fits_in_the_simulators_accept_queue(
    processes: tuple[Process, Process],
) -> None:
    """aiohttp's default backlog (128) overflowed under 5,000 calls started at 500/s:
    dropped SYNs, retransmitted 1, 3, 7 s later, added whole seconds to first bytes."""
    sim, gateway = processes
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert _listen_backlog(sim.url) == min(2048, somaxconn) == _listen_backlog(gateway.url)
