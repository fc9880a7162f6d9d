"""The load generator of ``benchmarks/peers.py``, run as its own process (pinned by it).

``python benchmarks/peers_load.py SPEC.json`` reads one job and prints one JSON
document on stdout. Two kinds of job:

* ``calls``: ``count`` POSTs (streams or whole responses) started at ``rate`` per
  second (so a listen backlog never overflows), all of them in flight together when
  each lasts longer than the ramp. For each call: status, time to the first body
  byte and to the end, from the moment that call was sent. aiohttp, one connection
  per call, no limit on connections. With ``control`` (a URL and its headers) and
  ``control_count``, that many more calls, spread evenly among the others, go there
  instead (unkeyed): the same requests sent direct to the simulator by the same
  process in the same seconds, so the difference of the two groups' times is the
  system's own, whatever the machine was doing (reported as ``control``).
* ``incident``: ``count`` business requests through the official openai SDK with
  its default retries (2) and ``timeout``, the SDK's own ``Idempotency-Key``
  (``client._idempotency_header``), ``concurrency`` at once. Its backoff is scaled
  like the latencies (``payonce.demo.application.ScaledAsyncOpenAI``).

The file-descriptor limit is raised to its hard limit first: 5,000 calls are 5,000
sockets here.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp


def raise_nofile() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def _one_call(
    session: aiohttp.ClientSession,
    job: dict[str, Any],
    index: int,
    results: list[Any],
    control: bool = False,
) -> None:
    target = job["control"] if control else job
    headers = dict(target["headers"])
    if job.get("key_prefix") and not control:
        headers["Idempotency-Key"] = f"{job['key_prefix']}-{index}-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    ttfb = None
    status = 0
    try:
        async with session.post(target["url"], data=job["body"], headers=headers) as answer:
            status = answer.status
            first = b""
            async for chunk in answer.content.iter_any():
                if ttfb is None and chunk:
                    ttfb, first = time.perf_counter() - started, chunk
        # A refusal says why (a problem+json's title and detail): the report counts reasons.
        reason = "" if status == 200 else f"status {status}: {_why(first)}"
        results[index] = [status, ttfb, time.perf_counter() - started, reason]
    except Exception as exc:  # a failed call is a result, not a crash of the run
        results[index] = [status, ttfb, time.perf_counter() - started, type(exc).__name__]


def _why(body: bytes) -> str:
    try:
        problem = json.loads(body)
    except ValueError:
        problem = None
    if isinstance(problem, dict) and "title" in problem:
        return f"{problem['title']}: {problem.get('detail', '')}"[:160]
    return body[:160].decode(errors="replace")


async def calls(job: dict[str, Any]) -> dict[str, Any]:
    count, rate = int(job["count"]), float(job["rate"])
    extra = int(job.get("control_count", 0)) if job.get("control") else 0
    total = count + extra
    # Every step-th start is a control call; the ramp keeps its length.
    step = total // extra if extra else 0
    rate *= total / count if count else 1.0
    results: list[Any] = [None] * count
    controls: list[Any] = [None] * extra
    timeout = aiohttp.ClientTimeout(total=float(job["timeout"]))
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        tasks = []
        began = time.perf_counter()
        made = sent = 0
        for index in range(total):
            delay = began + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            control = bool(step) and index % step == step - 1 and made < extra
            if not control and sent == count:
                control = True  # the rounding's remainder
            if control:
                call = _one_call(session, job, made, controls, control=True)
                made += 1
            else:
                call = _one_call(session, job, sent, results)
                sent += 1
            tasks.append(asyncio.create_task(call))
        await asyncio.gather(*tasks)
    return {"results": results, "control": controls}


async def incident(job: dict[str, Any]) -> dict[str, Any]:
    # Imported here: the SDK takes seconds to import on a busy core, and "calls" needs none of it.
    import httpx2
    import openai

    from payonce.demo.application import ScaledAsyncOpenAI

    client = ScaledAsyncOpenAI(
        base_url=job["base_url"],
        api_key=job["api_key"],
        timeout=float(job["timeout"]),
        default_headers=job.get("headers") or None,
        http_client=httpx2.AsyncClient(
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=200)
        ),
    )  # max_retries: the SDK's default (2)
    client.time_scale = float(job["time_scale"])
    client._idempotency_header = "Idempotency-Key"  # the SDK mints one key per call
    gate = asyncio.Semaphore(int(job["concurrency"]))
    outcomes: dict[str, int] = {}
    latencies: list[float] = []

    async def one(index: int) -> None:
        async with gate:
            started = time.perf_counter()
            try:
                await client.chat.completions.create(
                    model=job["model"],
                    messages=[{"role": "user", "content": f"Summarise ticket {index}."}],
                    max_tokens=64,
                )
                outcome = "ok"
                latencies.append(time.perf_counter() - started)
            except openai.APITimeoutError:
                outcome = "timeout"
            except openai.APIStatusError as exc:
                outcome = f"status {exc.status_code}"
            except openai.APIConnectionError:
                outcome = "connection"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    await asyncio.gather(*(one(index) for index in range(int(job["count"]))))
    await client.close()
    return {"outcomes": outcomes, "latencies": latencies}


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    limit = raise_nofile()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    runner = calls if job["kind"] == "calls" else incident
    document = asyncio.run(runner(job))
    document["nofile"] = limit
    json.dump(document, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
