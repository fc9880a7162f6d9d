"""The five stacks the demo runs, and running one of them.

=====  ===================================  ======================================
run    stack (application → … → provider)   what it shows
=====  ===================================  ======================================
A      app loop (2) → SDK (3) → retrying    the incident: every timeout
       proxy (8 s, 1 re-send) → provider    and every re-send is billed again
B      app loop (2) → SDK (3), one key per  payonce: one generation per business
       business request → payonce →         request, retries join or replay
       provider
C      app (1) → SDK (no retries, 30 s)     the report's mitigation: no waste,
       → provider                           but the slow tail fails
D      as B, but payonce → retrying proxy   payonce is not the last hop: the
       → provider                           proxy's re-sends bill again
E      as A, no key anywhere, with payonce  no code at all: the SDK's retries are
       (--dedupe-identical) between the     matched, the app's and the proxy's
       proxy and the provider               re-sends deduplicated
=====  ===================================  ======================================

Durations are the incident's, multiplied by ``time_scale`` when the processes
run; user latencies are reported back in the incident's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx2

from payonce.demo import stack
from payonce.demo.application import Outcome, ScaledAsyncOpenAI, ask

__all__ = ["RUNS", "DemoConfig", "RunResult", "RunSpec", "run_one"]

PROMPT = "Summarise this support ticket in three sentences: {business_id}"


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Everything ``payonce demo`` is told; durations in the incident's seconds."""

    requests: int = 1000
    time_scale: float = 0.1
    latency_p50: float = 4.0
    latency_p99: float = 30.0
    fail_rate: float = 0.01
    client_timeout: float = 10.0
    app_backoff: float = 0.3
    proxy_timeout: float = 8.0
    mitigation_timeout: float = 30.0
    concurrency: int = 50
    seed: int = 7
    runs: tuple[str, ...] = ("A", "B", "C", "D", "E")
    output: Path = field(default_factory=lambda: Path("payonce-demo"))


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One stack: which hops, which retries, whether a key is sent."""

    name: str
    title: str
    hops: tuple[str, ...]  # between the SDK and the provider: "proxy", "payonce"
    keyed: bool
    sdk_retries: int
    app_attempts: int
    mitigation: bool = False  # the incident report's fix: no retries, the long timeout
    dedupe: bool = False  # payonce --dedupe-identical: re-sends nothing numbers


RUNS = {
    "A": RunSpec("A", "usual stack", ("proxy",), False, 2, 2),
    "B": RunSpec("B", "payonce", ("payonce",), True, 2, 2),
    "C": RunSpec("C", "no retries", (), False, 0, 1, mitigation=True),
    "D": RunSpec("D", "proxy below payonce", ("payonce", "proxy"), True, 2, 2),
    "E": RunSpec("E", "no key, payonce", ("proxy", "payonce"), False, 2, 2, dedupe=True),
}

# How long an identical request counts as a re-send in run E, in the incident's
# seconds: longer than a business request's every attempt (2 app attempts x 3
# SDK attempts x 10 s, and the backoffs), far shorter than the gap between two
# business requests that could share a body (none do here: each names its id).
DEDUPE_WINDOW = 600.0


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run left behind: the users' outcomes and the files it wrote."""

    spec: RunSpec
    outcomes: tuple[Outcome, ...]
    ledger: list[dict[str, Any]]  # the provider's bill lines (GET /_sim/ledger entries)
    folder: Path
    calls: Path  # the call log reconcile reads: the gateway's, or the application's own
    still_generating: int  # generations not finished when the demo stopped waiting


@contextlib.asynccontextmanager
async def _upstream(
    spec: RunSpec, config: DemoConfig, folder: Path
) -> AsyncIterator[tuple[str, str]]:
    """Start the provider and the hops of ``spec``; yield the SDK's URL and the provider's."""
    scale = config.time_scale
    async with contextlib.AsyncExitStack() as hops:
        url = await hops.enter_async_context(
            stack.simulator(
                folder,
                p50=config.latency_p50 * scale,
                p99=config.latency_p99 * scale,
                fail_rate=config.fail_rate,
                seed=config.seed,
            )
        )
        sim_url = url
        for hop in reversed(spec.hops):  # built from the provider up
            if hop == "proxy":
                url = await hops.enter_async_context(
                    stack.retrying_proxy(
                        folder, url, timeout=config.proxy_timeout * scale, retries=1
                    )
                )
            else:
                # The gateway's own wait for a running duplicate, scaled like the rest.
                url = await hops.enter_async_context(
                    stack.gateway(
                        folder,
                        url,
                        wait_timeout=max(0.1, 60 * scale),
                        dedupe_window=DEDUPE_WINDOW * scale if spec.dedupe else None,
                    )
                )
        yield url, sim_url


async def _ledger(session: aiohttp.ClientSession, sim_url: str) -> dict[str, Any]:
    async with session.get(sim_url + "/_sim/ledger") as answer:
        document: dict[str, Any] = await answer.json()
        return document


async def run_one(
    spec: RunSpec, config: DemoConfig, on_done: Callable[[], None] | None = None
) -> RunResult:
    """Run ``config.requests`` business requests through ``spec``'s stack."""
    folder = config.output / f"run-{spec.name}"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("ledger.csv", "calls.jsonl", "calls.csv", "payonce.db"):
        (folder / stale).unlink(missing_ok=True)
    scale = config.time_scale
    timeout = (config.mitigation_timeout if spec.mitigation else config.client_timeout) * scale
    async with _upstream(spec, config, folder) as (url, sim_url):
        client = ScaledAsyncOpenAI(
            base_url=url + "/v1",
            api_key="sk-demo",
            max_retries=spec.sdk_retries,
            timeout=timeout,
            http_client=httpx2.AsyncClient(
                limits=httpx2.Limits(max_connections=None, max_keepalive_connections=200)
            ),
        )
        client.time_scale = scale
        gate = asyncio.Semaphore(config.concurrency)

        async def one(index: int) -> Outcome:
            async with gate:
                outcome = await ask(
                    client,
                    PROMPT.format(business_id=index),
                    f"{spec.name}-{index:06d}",
                    spec.keyed,
                    timeout=timeout,
                    app_attempts=spec.app_attempts,
                    app_backoff=config.app_backoff * scale,
                )
            if on_done is not None:
                on_done()
            return outcome

        outcomes = tuple(await asyncio.gather(*(one(i) for i in range(config.requests))))
        await client.close()
        async with aiohttp.ClientSession() as session:
            # Generations the clients gave up on still finish, and are billed.
            deadline = time.monotonic() + max(5.0, 60 * scale)
            while True:
                ledger = await _ledger(session, sim_url)
                if ledger["generating"] == 0 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
    calls = folder / "calls.jsonl"
    if "payonce" not in spec.hops:
        calls = folder / "calls.csv"
        _write_application_log(calls, outcomes)
    return RunResult(
        spec, outcomes, list(ledger["entries"]), folder, calls, int(ledger["generating"])
    )


def _write_application_log(path: Path, outcomes: tuple[Outcome, ...]) -> None:
    """Without a gateway, the application's own log: the answer each request got."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["business_id", "provider_request_id", "status"])
        for outcome in outcomes:
            writer.writerow([outcome.business_id, outcome.request_id or "", outcome.status])
