"""What does payonce add to a streamed response? Time to first byte, total time, memory.

Runs against ``payonce sim --latency fixed:0`` (answers at once; tokens paced only when
the run asks for it with ``X-Sim-Token-Ms``), straight to the simulator and through
``payonce serve`` with a fresh ``Idempotency-Key`` per stream (the keyed path: claim,
relay, record every event in SQLite, complete):

* **Time to first byte at 1 stream**: ``--ttfb-runs`` streams one after another; the
  time from sending the request to the first body byte. Median and p90 of each path,
  and the median added by payonce. Target: within 2 ms.
* **Total time** for streams of ``--events`` events, unpaced, at 1 stream and at
  ``--concurrency`` concurrent streams: wall time until every stream has ended.
* **Gateway memory** at ``--concurrency`` concurrent streams of ``--events`` events,
  paced (``--memory-token-ms`` per token) so that all of them are alive in the gateway
  at once: peak resident memory (VmHWM and sampled VmRSS). Target: under 150 MiB.

Pinning as in gateway_overhead.py: the gateway on core 1, the simulator and this load
generator (aiohttp, in this process) on core 0. Latency figures are noisy on a shared
machine; compare the two paths within one run.

Usage::

    .venv/bin/python benchmarks/streaming_overhead.py            # about a minute
    .venv/bin/python benchmarks/streaming_overhead.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

AUTH = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
# About 4,000 characters: the simulator answers with as many tokens as the prompt
# has (~chars/4), capped by max_tokens, one event per token.
LONG_PROMPT = "Explain idempotency keys for retried LLM calls in detail. " * 70


@dataclass(frozen=True)
class Options:
    ttfb_runs: int
    events: int
    concurrency: int
    memory_token_ms: int
    pin: bool


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ttfb-runs", type=int, default=200)
    parser.add_argument("--events", type=int, default=1000, help="content events per stream")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--memory-token-ms", type=int, default=5)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: small numbers")
    args = parser.parse_args(argv)
    if args.quick:
        args.ttfb_runs, args.events, args.concurrency = 20, 100, 20
    return Options(
        args.ttfb_runs, args.events, args.concurrency, args.memory_token_ms, not args.no_pin
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def process(
    command: list[str], ready: str, core: int | None, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    if core is not None and shutil.which("taskset"):
        command = ["taskset", "-c", str(core), *command]
    with log.open("wb") as handle:
        child = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", int(ready.rsplit(":", 1)[1])), 0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"{command} did not start:\n{log.read_text()}")
        yield child
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()


def body(events: int, stream: bool = True) -> dict[str, object]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": events,
        "stream": stream,
    }


async def one_stream(
    session: aiohttp.ClientSession, url: str, keyed: bool, events: int, token_ms: int
) -> tuple[float, float, int]:
    """(time to first byte, total time, bytes) of one stream."""
    headers = {**AUTH, "X-Sim-Token-Ms": str(token_ms)}
    if keyed:
        headers["Idempotency-Key"] = f"bench-{uuid.uuid4()}"
    started = time.perf_counter()
    first = None
    size = 0
    async with session.post(
        url + "/v1/chat/completions", json=body(events), headers=headers
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}: {await resp.text()}")
        async for chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - started
            size += len(chunk)
    total = time.perf_counter() - started
    return first or total, total, size


async def ttfb(url: str, keyed: bool, runs: int) -> list[float]:
    async with aiohttp.ClientSession() as session:
        await one_stream(session, url, keyed, 16, 0)  # warm the connection
        return [(await one_stream(session, url, keyed, 16, 0))[0] for _ in range(runs)]


async def concurrent_total(
    url: str, keyed: bool, streams: int, events: int, token_ms: int
) -> float:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(
            *(one_stream(session, url, keyed, events, token_ms) for _ in range(streams))
        )
        return time.perf_counter() - started


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def memory_run(url: str, pid: int, options: Options) -> tuple[int, int, float]:
    """(sampled peak RSS KiB, VmHWM KiB, wall seconds) with every stream alive at once."""
    peak = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_kib(pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    wall = await concurrent_total(
        url, True, options.concurrency, options.events, options.memory_token_ms
    )
    done.set()
    await sampler
    return peak, rss_kib(pid, "VmHWM"), wall


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    payonce = [sys.executable, "-m", "payonce"]
    with tempfile.TemporaryDirectory(prefix="payonce-stream-bench-") as tmp:
        tmpdir = Path(tmp)
        sim_port, gw_port = free_port(), free_port()
        sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
        pin = options.pin and (os.cpu_count() or 1) >= 2
        sim_cmd = [*payonce, "sim", "--latency", "fixed:0", "--port", str(sim_port)]
        gw_cmd = [*payonce, "serve", "--upstream", sim_url, "--store", f"sqlite:///{tmpdir}/bench.db",
                  "--port", str(gw_port), "--log-level", "warning"]  # fmt: skip
        if pin:
            os.sched_setaffinity(0, {0})
        with (
            process(sim_cmd, sim_url, 0 if pin else None, tmpdir / "sim.log"),
            process(gw_cmd, gw_url, 1 if pin else None, tmpdir / "gw.log"),
        ):
            print(f"# streaming overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            print(
                f"# pinning: {'gateway on core 1, simulator and load on core 0' if pin else 'none'}"
            )
            direct = asyncio.run(ttfb(sim_url, False, options.ttfb_runs))
            through = asyncio.run(ttfb(gw_url, True, options.ttfb_runs))
            added = statistics.median(through) - statistics.median(direct)
            print("\n| time to first byte, 1 stream | median | p90 |")
            print("|---|---:|---:|")
            for name, values in (("direct to sim", direct), ("payonce, keyed", through)):
                p90 = statistics.quantiles(values, n=10)[-1]
                median = ms(statistics.median(values))
                print(f"| {name} ({len(values)} streams) | {median} | {ms(p90)} |")
            verdict = "PASS" if added <= 0.002 else "MISS"
            print(f"\nadded time to first byte (median): {ms(added)} (target <= 2 ms: {verdict})")

            title = f"total time, streams of {options.events} events, unpaced"
            print(f"\n| {title} | direct | payonce, keyed | ratio |")
            print("|---|---:|---:|---:|")
            for streams in (1, options.concurrency):
                d = asyncio.run(concurrent_total(sim_url, False, streams, options.events, 0))
                p = asyncio.run(concurrent_total(gw_url, True, streams, options.events, 0))
                print(f"| {streams} concurrent | {d:.2f} s | {p:.2f} s | {p / d:.2f}x |")

        # A fresh gateway, so its high-water mark is this run's alone.
        mem_port = free_port()
        mem_url = f"http://127.0.0.1:{mem_port}"
        mem_cmd = [*payonce, "serve", "--upstream", sim_url, "--store",
                   f"sqlite:///{tmpdir}/memory.db", "--port", str(mem_port),
                   "--log-level", "warning"]  # fmt: skip
        with (
            process(sim_cmd, sim_url, 0 if pin else None, tmpdir / "sim2.log"),
            process(mem_cmd, mem_url, 1 if pin else None, tmpdir / "gw2.log") as fresh,
        ):
            idle = rss_kib(fresh.pid)
            peak, hwm, wall = asyncio.run(memory_run(mem_url, fresh.pid, options))
            verdict = "PASS" if hwm < 150 * 1024 else "MISS"
            print(
                f"\ngateway memory, {options.concurrency} concurrent streams of"
                f" {options.events} events at {options.memory_token_ms} ms/token ({wall:.1f} s):"
                f" idle {idle / 1024:.0f} MiB, peak RSS sampled {peak / 1024:.0f} MiB,"
                f" VmHWM {hwm / 1024:.0f} MiB (target < 150 MiB: {verdict})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
