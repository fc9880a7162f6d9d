"""Thousands of keyed calls in flight on one worker (issue 19, workload 4).

* Descriptors: each keyed call in flight holds two sockets in the gateway (the
  client's and the upstream's) and one in the simulator. Started under a shell's
  usual soft limit (1024; 256 here, to keep the test small), the gateway answered
  502 or reset the connection once the limit was reached, although the hard limit
  allowed far more. Both processes now raise their soft limit to the hard one at
  startup, as nginx (``worker_rlimit_nofile``) and Go programs do.
* Accept queue: the simulator listened with aiohttp's backlog of 128.
* Redis connections: redis-py 8's pool holds at most 100 connections and then
  fails the command ("Too many connections"): 5,000 concurrent calls on a busy
  machine got 289 503s. A Redis that stalls for a moment (paused here) makes the
  same pile-up: every event-loop turn's pipeline waits on its own connection.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from payonce.gateway.upstream_http import MAX_IDLE
from tests.support.processes import Process, _wait_ready, free_port
from tests.support.redis import running_redis
from tests.support.waiting import wait_until

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


async def _concurrent_calls(
    url: str,
    count: int,
    delay_ms: int = 1500,
    during: Callable[[], Awaitable[None]] | None = None,
    spacing: float = 0.0,
) -> Counter[object]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(index: int) -> object:
            await asyncio.sleep(index * spacing)
            headers = {
                "Authorization": "Bearer sk-open-files",
                "Idempotency-Key": f"fd-{uuid.uuid4()}",
                "X-Sim-Delay-Ms": str(delay_ms),  # long enough for all to be in flight
            }
            try:
                async with session.post(
                    f"{url}/v1/chat/completions", json=BODY, headers=headers
                ) as r:
                    body = await r.text()
            except aiohttp.ClientError as exc:
                return type(exc).__name__
            return r.status if r.status == 200 else f"{r.status}: {body[:120]}"

        calls = asyncio.gather(*(one(index) for index in range(count)))
        if during is not None:
            await during()
        return Counter(await calls)


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


def _connections_to(port: int) -> int:
    """Established TCP connections whose far end is 127.0.0.1:``port`` (/proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            count += 1
    return count


async def test_after_a_burst_the_gateway_keeps_few_idle_upstream_connections(
    processes: tuple[Process, Process],
) -> None:
    """A burst of 300 calls left 300 idle connections to the upstream, kept until the
    next request's release trimmed them; now at most ``MAX_IDLE`` are kept.

    The clients have their answers a moment before the gateway puts the last
    connections back (and closes the extra ones), which a busy machine stretches:
    wait for the count to fall. Without the bound it never would: nothing else
    closes them until another request comes, and the simulator keeps them for 75 s.
    """
    sim, gateway = processes
    assert await _concurrent_calls(gateway.url, CALLS) == Counter({200: CALLS})
    port = int(sim.url.rsplit(":", 1)[1])
    wait_until(
        lambda: _connections_to(port) <= MAX_IDLE,
        f"at most {MAX_IDLE} connections to the simulator",
        timeout=10,
    )
    assert _connections_to(port) > 0  # kept alive, not all closed


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


async def test_a_stalled_redis_does_not_exhaust_the_gateways_connection_pool(
    processes: tuple[Process, Process], tmp_path: Path
) -> None:
    sim, _ = processes
    with running_redis(tmp_path) as redis:
        args = ["serve", "--upstream", sim.url, "--store", redis.url, "--no-otel"]
        gateway = _start(args, "/_payonce/health", tmp_path, low_limit=False)
        try:
            assert redis.popen is not None
            pid = redis.popen.pid

            async def stall() -> None:
                try:
                    await asyncio.sleep(1.5)  # the claims arrive, pipeline after pipeline
                finally:
                    os.kill(pid, signal.SIGCONT)

            # One call first: the store connects and learns its scripts before the stall.
            assert await _concurrent_calls(gateway.url, 1, delay_ms=0) == Counter({200: 1})
            os.kill(pid, signal.SIGSTOP)
            # Arriving over the stall, not at once: each loop turn's claims are a pipeline.
            answers = await _concurrent_calls(
                gateway.url, CALLS, delay_ms=100, during=stall, spacing=1.2 / CALLS
            )
        finally:
            gateway.stop()
    assert answers == Counter({200: CALLS})
