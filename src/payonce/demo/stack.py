"""The demo's processes: the simulated provider, the retrying proxy and the gateway.

Each is a real child process on a free 127.0.0.1 port, started with the same
Python, stopped with SIGTERM (the gateway then flushes its call log).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from payonce.errors import PayonceError

__all__ = ["free_port", "gateway", "retrying_proxy", "simulator"]


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def _process(
    args: list[str], ready: str, log: Path, *, timeout: float = 30.0
) -> AsyncIterator[None]:
    with log.open("wb") as handle:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdout=handle, stderr=asyncio.subprocess.STDOUT
        )
    try:
        async with aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                if process.returncode is not None:
                    raise PayonceError(f"{args[1:3]} exited with {process.returncode}; see {log}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(ready) as answer:
                        if answer.status < 500:
                            break
                if loop.time() > deadline:
                    raise PayonceError(
                        f"{args[1:3]} did not start within {timeout:.0f}s; see {log}"
                    )
                await asyncio.sleep(0.05)
        yield
    finally:
        if process.returncode is None:
            process.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 20)
        if process.returncode is None:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def simulator(
    folder: Path, *, p50: float, p99: float, fail_rate: float, seed: int
) -> AsyncIterator[str]:
    """``payonce sim`` with the incident's latency (already scaled) and its own ledger CSV."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["-m", "payonce", "sim", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--latency", f"lognormal:p50={p50 * 1000:.3f}ms,p99={p99 * 1000:.3f}ms"]
    args += ["--seed", str(seed), "--ledger", str(folder / "ledger.csv")]
    if fail_rate > 0:
        args += ["--fail", f"500:{fail_rate}"]
    async with _process(args, url + "/_sim/health", folder / "sim.log"):
        yield url


@contextlib.asynccontextmanager
async def retrying_proxy(
    folder: Path, upstream: str, *, timeout: float, retries: int
) -> AsyncIterator[str]:
    """The anti-pattern proxy of :mod:`payonce.demo.proxy` in front of ``upstream``."""
    port = free_port()
    args = ["-m", "payonce.demo.proxy", "--upstream", upstream, "--port", str(port)]
    args += ["--timeout", f"{timeout}", "--retries", str(retries)]
    url = f"http://127.0.0.1:{port}"
    async with _process(args, url + "/_sim/health", folder / "proxy.log"):
        yield url


@contextlib.asynccontextmanager
async def gateway(
    folder: Path, upstream: str, *, wait_timeout: float, dedupe_window: float | None = None
) -> AsyncIterator[str]:
    """``payonce serve`` in front of ``upstream``, with its call log in ``folder``
    (``dedupe_window``: ``--dedupe-identical`` for that many seconds)."""
    port = free_port()
    args = ["-m", "payonce", "serve", "--upstream", upstream, "--port", str(port)]
    args += ["--store", f"sqlite:///{folder / 'payonce.db'}"]
    args += ["--call-log", str(folder / "calls.jsonl"), "--log-level", "warning"]
    args += ["--wait-timeout", f"{wait_timeout}s", "--no-otel"]
    if dedupe_window is not None:
        args += ["--dedupe-identical", f"{dedupe_window}s"]
    url = f"http://127.0.0.1:{port}"
    async with _process(args, url + "/_payonce/health", folder / "gateway.log"):
        yield url
