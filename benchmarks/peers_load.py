"""The load generator of ``benchmarks/peers.py``, run as its own process (pinned by it).

``python benchmarks/peers_load.py SPEC.json`` reads one job and prints one JSON
document on stdout. Two kinds of job:

* ``calls``: ``count`` POSTs (streams or whole responses) started at ``rate`` per
  second (so a listen backlog never overflows), all of them in flight together when
  each lasts longer than the ramp. For each call: status, time to the first body
  byte and to the end, from the moment that call was sent. One connection per
  call, no limit on connections, a plain asyncio protocol (:class:`_Exchange`).
  With ``control`` (a URL and its headers) and ``control_count``, that many more
  calls, spread evenly among the others, go there instead (unkeyed): the same
  requests sent direct to the simulator by the same process in the same seconds,
  so the difference of the two groups' times is the system's own, whatever the
  machine was doing (reported as ``control``).
  With ``gaps``, every call also notes the time between consecutive reads of its
  body once the first byte came (a stream at token rate: one event per read);
  the job reports their p50, p99 and maximum over all its calls (``gaps``), and
  the ``data:`` lines its answered calls received (``events``): what the CPU per
  event divides by, counted rather than assumed (the simulator answers a
  prompt's length in tokens, capped by ``max_tokens``, not ``max_tokens``).
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
import urllib.parse
import uuid
from array import array
from pathlib import Path
from typing import Any


def raise_nofile() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class _Exchange(asyncio.Protocol):
    """One HTTP/1.1 request on its own connection, read to the end of its body.

    A plain protocol rather than aiohttp's client: at 5,000 calls the load
    generator's own CPU on the load core delayed every call, direct ones included
    (benchmarks/NOTEBOOK.md, "Workload 4 at full size"), and this needs a fraction of
    it. It notes the time of the first body byte and of the body's end (by its
    Content-Length, or the chunked body's last chunk, or the server's close).
    """

    def __init__(self, request: bytes, started: float, gaps: array | None = None) -> None:
        self.request = request
        self.started = started
        self.gaps = gaps  # where the time between reads goes, if anywhere
        self.last_read = 0.0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.status = 0
        self.ttfb: float | None = None
        self.total: float | None = None
        self.first = b""  # the body's beginning, for a refusal's reason
        self.length: int | None = None  # Content-Length, when given
        self.chunked = False
        self.received = 0
        self.tail = b""  # a chunked body's last bytes, to see its end
        self.events = 0  # data lines received (with gaps: streams at token rate)
        self.carry = b""  # the last bytes of the previous read, for a line split by reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.request)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        if self.status == 0:  # still reading the head
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end].lower(), self.head[end + 4 :]
            self.status = int(head[9:12])
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    self.length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value:
                    self.chunked = True
            if not data and self.length != 0:
                return
        now = time.perf_counter()
        if self.ttfb is None:
            self.ttfb = now - self.started
        elif self.gaps is not None:
            self.gaps.append(now - self.last_read)
        self.last_read = now
        if len(self.first) < 4096:
            self.first += data[:4096]
        self.received += len(data)
        if self.gaps is not None:
            joined = self.carry + data
            self.events += joined.count(b"data:")
            self.carry = joined[-4:]  # shorter than b"data:": never counted twice
        self.tail = (self.tail + data)[-7:]
        if (self.length is not None and self.received >= self.length) or (
            self.chunked and self.tail.endswith(b"0\r\n\r\n")
        ):
            self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        # A server that closes instead of framing its body: the close is the end.
        if self.status and not self.chunked and self.length is None:
            self._finish()
        if not self.done.done():
            self.done.set_result(None)

    def _finish(self) -> None:
        if self.total is None:
            self.total = time.perf_counter() - self.started
            if self.transport is not None:
                self.transport.close()
        if not self.done.done():
            self.done.set_result(None)


def _request(target: dict[str, Any], body: bytes, headers: dict[str, str]) -> bytes:
    url = urllib.parse.urlsplit(target["url"])
    lines = [f"POST {url.path or '/'} HTTP/1.1", f"Host: {url.netloc}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode() + body


async def _one_call(
    job: dict[str, Any],
    index: int,
    results: list[Any],
    control: bool = False,
    gaps: array | None = None,
) -> None:
    target = job["control"] if control else job
    headers = dict(target["headers"])
    if job.get("key_prefix") and not control:
        headers["Idempotency-Key"] = f"{job['key_prefix']}-{index}-{uuid.uuid4().hex[:8]}"
    url = urllib.parse.urlsplit(target["url"])
    started = time.perf_counter()
    exchange = _Exchange(_request(target, job["body"].encode(), headers), started, gaps)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(float(job["timeout"])):
            await loop.create_connection(lambda: exchange, url.hostname, url.port)
            await exchange.done
    except Exception as exc:  # a failed call is a result, not a crash of the run
        if exchange.transport is not None:
            exchange.transport.abort()
        results[index] = [exchange.status, exchange.ttfb, time.perf_counter() - started,
                          type(exc).__name__]  # fmt: skip
        return
    total = exchange.total if exchange.total is not None else time.perf_counter() - started
    if exchange.status == 200:
        reason = "" if exchange.total is not None else "incomplete body"
    else:
        # A refusal says why (a problem+json's title and detail): the report counts reasons.
        reason = f"status {exchange.status}: {_why(_unchunked(exchange.first))}"
    results[index] = [exchange.status, exchange.ttfb, total, reason]
    if gaps is not None and not reason:
        job["_events"] = job.get("_events", 0) + exchange.events


def _unchunked(body: bytes) -> bytes:
    """The first chunk's data, if ``body`` is chunked (a size line first); else ``body``."""
    size, crlf, rest = body.partition(b"\r\n")
    if crlf and size and all(c in b"0123456789abcdefABCDEF" for c in size):
        return rest[: int(size, 16)]
    return body


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
    gaps = array("d") if job.get("gaps") else None
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
            call = _one_call(job, made, controls, control=True)
            made += 1
        else:
            call = _one_call(job, sent, results, gaps=gaps)
            sent += 1
        tasks.append(asyncio.create_task(call))
    await asyncio.gather(*tasks)
    document: dict[str, Any] = {"results": results, "control": controls}
    if gaps is not None:
        ordered = sorted(gaps)

        def at(share: float) -> float | None:
            return (
                ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000
                if ordered
                else None
            )

        document["events"] = job.get("_events", 0)
        document["gaps"] = {
            "count": len(ordered),
            "p50_ms": at(0.5),
            "p99_ms": at(0.99),
            "max_ms": ordered[-1] * 1000 if ordered else None,
        }
    return document


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
    if not job.get("no_key"):
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
