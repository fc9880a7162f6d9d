"""Real processes for replica tests: gateways sharing one store, a real Redis, one simulator.

Each test gets its own ``redis-server`` on a free port (:mod:`tests.support.redis`),
so a test may stop, freeze or restart it. Gateways start in parallel: a test with
three replicas waits for the slowest, not for the sum.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx2 as httpx
import pytest

from tests.support.processes import Process, start_payonce
from tests.support.redis import RedisServer, running_redis
from tests.support.sim import Sim

__all__ = [
    "AUTH",
    "CHAT",
    "Gateways",
    "alive",
    "children",
    "command_line",
    "post",
    "post_many",
    "wait_until",
]

CHAT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Say hello to every replica"}],
    "max_tokens": 16,
}
AUTH = {"Authorization": "Bearer sk-test-replicas"}

# Starts gateways: start(count, *flags, store=URL) -> one Process per gateway.
Gateways = Callable[..., list[Process]]


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: it may be stopped, frozen or restarted."""
    directory = tmp_path / "redis"
    directory.mkdir()
    with running_redis(directory) as server:
        yield server


@pytest.fixture
def start_gateways(fresh_sim: Sim, tmp_path: Path) -> Iterator[Gateways]:
    """Start ``count`` gateways at once in front of the simulator, each on its own port."""
    started: list[Process] = []

    def start(count: int, *flags: str, store: str) -> list[Process]:
        args = ["serve", "--upstream", fresh_sim.url, "--store", store, *flags]
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            futures = [
                pool.submit(start_payonce, args, log_dir=tmp_path, ready_path="/_payonce/health")
                for _ in range(count)
            ]
            processes = [future.result() for future in futures]
        started.extend(processes)
        return processes

    yield start
    for process in started:
        process.stop()


def post(
    url: str,
    key: str | None,
    *,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> httpx.Response:
    """POST a chat completion through ``url``, with ``key`` as the Idempotency-Key."""
    sent = {**AUTH, **(headers or {})}
    if key is not None:
        sent["Idempotency-Key"] = key
    return httpx.post(
        url + "/v1/chat/completions", json=body or CHAT, headers=sent, timeout=timeout
    )


async def post_many(
    urls: Sequence[str],
    count: int,
    key: str,
    *,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> list[tuple[int, str | None, bytes]]:
    """``count`` concurrent POSTs with one key, spread round-robin over ``urls``.

    Returns (status, Idempotent-Replayed, raw body bytes) per request, in order.
    """
    sent = {**AUTH, "Idempotency-Key": key, **(headers or {})}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(index: int) -> tuple[int, str | None, bytes]:
            url = urls[index % len(urls)] + "/v1/chat/completions"
            async with session.post(url, json=body or CHAT, headers=sent) as response:
                raw = await response.read()
                return response.status, response.headers.get("idempotent-replayed"), raw

        return list(await asyncio.gather(*(one(index) for index in range(count))))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` (a safety net, not a measure)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
