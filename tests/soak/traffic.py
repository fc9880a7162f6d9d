"""The soak's traffic: one operation at a time, each knowing how many bills it may cause.

An operation (``Op``) is one logical call of an application: a keyed call
retried until it has its answer, an unkeyed call sent once, a burst of
concurrent duplicates, a call whose client leaves, ... Every request body
names the operation in OpenAI's ``user`` field, which the simulator writes into
each ledger entry, so the bill can be checked per operation rather than only in
total. Each operation records the range of billed generations it may cause
(``low``..``high``) and why (``reasons``): 1 for a keyed call whatever happened
to its attempts, plus the double bills docs/gateway.md documents.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

PATH = "/v1/chat/completions"
DONE = b"data: [DONE]\n"  # the gateway puts its own "id: N-<run>" line after it
TENANTS = [
    {"Authorization": "Bearer sk-soak-tenant-1"},
    {"Authorization": "Bearer sk-soak-tenant-2"},
    {"x-api-key": "sk-ant-soak-tenant-3"},
    {},  # the anonymous tenant
]
# How often each kind of operation is started (relative weights).
KINDS = {
    "keyed": 26,
    "keyed_stream": 12,
    "unkeyed": 12,
    "unkeyed_stream": 6,
    "concurrent": 8,
    "after": 8,
    "mismatch": 5,
    "leave": 5,
    "leave_stream": 5,
    "unkeyed_leave": 3,
    "unkeyed_leave_stream": 3,
    "drop": 2,
    "drop_stream": 2,
    "die_stream": 3,
}
OP_DEADLINE = 60.0  # a keyed operation must have its answer within this


@dataclass
class Attempt:
    """What one HTTP request got back, classified."""

    outcome: str  # ok, cut, left, refused, timeout, broken, problem:<type>, upstream:<status>
    status: int | None = None
    body: bytes = b""
    replayed: str | None = None
    at: float = 0.0  # when it was sent
    end: float = 0.0  # when its answer (or its failure) came


@dataclass
class Op:
    """One logical call and the bills it may cause."""

    id: str
    kind: str
    key: str | None
    started: float
    headers: dict[str, str] = field(default_factory=dict)  # its tenant's credential
    pinned: str | None = None  # the gateway its first attempt goes to (else one at random)
    low: int = 0
    high: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    attempts: list[Attempt] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    finished: bool = False

    def bills(self, reason: str, low: int = 1, high: int | None = None) -> None:
        self.low += low
        self.high += low if high is None else high
        self.reasons[reason] += 1


class Traffic:
    """Drives operations against a set of gateways that share one store."""

    def __init__(self, name: str, gateways: list[str], rng: random.Random) -> None:
        self.name = name
        self.gateways = gateways
        self.rng = rng
        self.ops: list[Op] = []
        self.restart_window: tuple[float, float] | None = None
        self.restarting: str | None = None  # the gateway URL being restarted, if any
        self._tasks: set[asyncio.Task[None]] = set()
        self._pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Traffic:
        # Keyed calls reuse kept-alive connections (as SDKs do); unkeyed ones open a
        # connection each, so a refused connection proves nothing was sent.
        self._pooled = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        self._fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        assert self._pooled is not None and self._fresh is not None
        await self._pooled.close()
        await self._fresh.close()

    # -- scheduling -------------------------------------------------------------

    async def run(self, seconds: float, rate: float) -> None:
        """Start operations at ``rate`` per second for ``seconds``, then wait for them all."""
        kinds = list(KINDS)
        weights = list(KINDS.values())
        start = time.monotonic()
        n = 0
        while (now := time.monotonic()) < start + seconds:
            due = start + n / rate
            if due > now:
                await asyncio.sleep(due - now)
            self.start(f"{self.name}-{n}", self.rng.choices(kinds, weights)[0])
            n += 1
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=OP_DEADLINE + 30)

    def start(self, name: str, kind: str, pinned: str | None = None) -> None:
        """Start one operation of ``kind`` in the background."""
        op = Op(f"{name}-{kind}", kind, None, time.monotonic(), pinned=pinned)
        self.ops.append(op)
        task = asyncio.create_task(self._run_op(op))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start_in_flight(self, url: str) -> None:
        """Slow calls sent to ``url`` just before it is stopped: running when SIGTERM comes."""
        kinds = ["slow_keyed", "slow_keyed_stream", "slow_unkeyed"] * 2
        # and two that outlast uvicorn's 5 s for open connections: the drain must finish them
        kinds += ["slower_keyed", "slower_keyed_stream"]
        for n, kind in enumerate(kinds):
            self.start(f"{self.name}-restart-{n}", kind, pinned=url)

    async def _run_op(self, op: Op) -> None:
        try:
            await getattr(self, "_op_" + op.kind)(op)
        except Exception as exc:  # a defect of the driver or the gateway: report, never hide
            op.defects.append(f"driver raised {exc!r}")
        op.finished = True

    # -- one request ------------------------------------------------------------

    def _url(self) -> str:
        return self.rng.choice(self.gateways)

    def _body(self, op: Op, *, stream: bool, text: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": text or f"soak {op.id} please answer"}],
            "max_tokens": 16,
            "user": op.id,
        }
        if stream:
            body["stream"] = True
        return body

    def _in_restart(self, attempt: Attempt) -> bool:
        window = self.restart_window
        if self.restarting is not None:
            return True
        return window is not None and attempt.at <= window[1] + 1 and attempt.end >= window[0] - 1

    async def send(self, *args: Any, **kwargs: Any) -> Attempt:
        """POST a chat completion to a gateway and classify what came back."""
        attempt = await self._send(*args, **kwargs)
        attempt.end = time.monotonic()
        return attempt

    async def _send(
        self,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        *,
        fresh: bool = False,
        timeout: float = 30.0,
        leave_after_events: int | None = None,
    ) -> Attempt:
        session = self._fresh if fresh else self._pooled
        assert session is not None
        stream = bool(body.get("stream"))
        at = time.monotonic()
        try:
            async with session.post(
                url + PATH,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json", **headers},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                replayed = response.headers.get("idempotent-replayed")
                if leave_after_events is not None and response.status == 200:
                    seen = 0
                    while seen < leave_after_events:
                        line = await response.content.readline()
                        if not line:
                            break
                        seen += line == b"\n"
                    response.close()  # the client leaves mid-stream
                    return Attempt("left", 200, b"", replayed, at)
                data = await response.read()
                return self._classify(response, data, stream, replayed, at)
        except aiohttp.ClientConnectorError:
            return Attempt("refused", at=at)
        except TimeoutError:
            return Attempt("timeout", at=at)
        except aiohttp.ClientPayloadError:
            return Attempt("cut", 200, at=at)
        except aiohttp.ClientError as exc:
            return Attempt(f"broken:{type(exc).__name__}", at=at)

    @staticmethod
    def _classify(
        response: aiohttp.ClientResponse, data: bytes, stream: bool, replayed: str | None, at: float
    ) -> Attempt:
        status = response.status
        content_type = response.headers.get("content-type", "")
        if status == 200:
            if stream and DONE not in data[-64:]:
                return Attempt("cut", status, data, replayed, at)
            return Attempt("ok", status, data, replayed, at)
        if content_type.startswith("application/problem+json"):
            kind = str(orjson.loads(data).get("type", "")).rsplit("#", 1)[-1].rsplit("/", 1)[-1]
            return Attempt(f"problem:{kind}", status, data, replayed, at)
        if content_type.startswith("application/json"):  # the simulator's own error
            return Attempt(f"upstream:{status}", status, data, replayed, at)
        return Attempt(f"unexpected:{status} {content_type}", status, data, replayed, at)

    # -- keyed calls ----------------------------------------------------------------

    async def keyed(
        self,
        op: Op,
        body: dict[str, Any],
        headers: dict[str, str],
        first: dict[str, str] | None = None,
    ) -> Attempt | None:
        """Send ``body`` with the op's key until it has its answer (as a retrying client does).

        ``first``: extra headers of the first attempt only (a fault to inject).
        Counts a documented double bill when the first attempt was a drop after compute.
        """
        assert op.key is not None
        deadline = time.monotonic() + OP_DEADLINE
        sent = {**headers, "Idempotency-Key": op.key}
        attempt_no = 0
        while time.monotonic() < deadline:
            extra = first if attempt_no == 0 and first else {}
            url = op.pinned if attempt_no == 0 and op.pinned else self._url()
            attempt = await self.send(url, body, {**sent, **extra})
            op.attempts.append(attempt)
            if extra.get("X-Sim-Drop") == "1":
                self._count_drop(op, attempt)
            attempt_no += 1
            if attempt.outcome == "ok":
                return attempt
            if not self._retryable(op, attempt):
                op.defects.append(
                    f"keyed attempt {attempt_no}: {attempt.outcome} {attempt.body[:300]!r}"
                )
                return None
            await asyncio.sleep(0.1 + self.rng.random() * 0.3)
        outcomes = Counter(a.outcome for a in op.attempts)
        op.defects.append(f"no answer within {OP_DEADLINE}s: {dict(outcomes)}")
        return None

    def _retryable(self, op: Op, attempt: Attempt) -> bool:
        outcome = attempt.outcome
        if outcome.startswith("upstream:"):  # the simulator's --fail: refused before any work
            return attempt.status in (429, 500, 503)
        if outcome in ("problem:in-progress", "problem:upstream-unavailable"):
            return True
        if outcome == "problem:shutting-down":  # a call that outlasted the server's grace
            return self._in_restart(attempt)
        if outcome == "cut":  # a stream cut short (an injected fault, or a restart)
            return True
        if outcome in ("refused", "timeout") or outcome.startswith("broken:"):
            return True  # a connection lost; the key makes the retry safe
        return outcome.startswith("problem:store-") and attempt.status == 503

    def _count_drop(self, op: Op, attempt: Attempt) -> None:
        # docs/gateway.md, failure mode 1: the upstream billed, the answer never came,
        # the key was released and the retry runs (and bills) again.
        if attempt.outcome in ("problem:upstream-unavailable", "cut"):
            op.bills("double bill: upstream dropped after compute (failure mode 1)")
        elif attempt.outcome.startswith("upstream:") or attempt.outcome == "refused":
            op.reasons["drop not reached: refused before any work"] += 1
        else:  # the drop and something else (a restart) at once: either may have billed
            op.bills("double bill: drop during a restart", 0, 1)

    def _new_key(self, op: Op) -> None:
        op.key = f"soak-{op.id}-{self.rng.getrandbits(48):012x}"
        op.headers = self.rng.choice(TENANTS)

    async def _keyed_op(self, op: Op, *, stream: bool, first: dict[str, str] | None = None) -> None:
        self._new_key(op)
        headers = op.headers
        op.bills("keyed call completed")
        await self.keyed(op, self._body(op, stream=stream), headers, first)

    async def _op_keyed(self, op: Op) -> None:
        await self._keyed_op(op, stream=False)

    async def _op_keyed_stream(self, op: Op) -> None:
        await self._keyed_op(op, stream=True)

    async def _op_slow_keyed(self, op: Op) -> None:
        await self._keyed_op(op, stream=False, first={"X-Sim-Delay-Ms": "1500"})

    async def _op_slow_keyed_stream(self, op: Op) -> None:
        await self._keyed_op(op, stream=True, first={"X-Sim-Token-Ms": "60"})

    async def _op_slower_keyed(self, op: Op) -> None:
        await self._keyed_op(op, stream=False, first={"X-Sim-Delay-Ms": "6500"})

    async def _op_slower_keyed_stream(self, op: Op) -> None:
        await self._keyed_op(op, stream=True, first={"X-Sim-Token-Ms": "450"})

    async def _op_drop(self, op: Op) -> None:
        await self._keyed_op(op, stream=False, first={"X-Sim-Drop": "1"})

    async def _op_drop_stream(self, op: Op) -> None:
        await self._keyed_op(op, stream=True, first={"X-Sim-Drop": "1"})

    async def _op_die_stream(self, op: Op) -> None:
        # The upstream dies mid-stream: nothing billed, nothing stored, the retry runs.
        await self._keyed_op(op, stream=True, first={"X-Sim-Die-After": "3"})

    async def _op_concurrent(self, op: Op) -> None:
        self._new_key(op)
        headers = op.headers
        stream = self.rng.random() < 0.4
        body = self._body(op, stream=stream)
        op.bills("keyed call completed")
        slow = {"X-Sim-Delay-Ms": "300"}
        got = await asyncio.gather(*(self.keyed(op, body, {**headers, **slow}) for _ in range(3)))
        answers = [a for a in got if a is not None]
        if len(answers) == 3 and len({_payload(a.body, stream) for a in answers}) != 1:
            op.defects.append("concurrent duplicates got different answers")

    async def _op_after(self, op: Op) -> None:
        self._new_key(op)
        headers = op.headers
        stream = self.rng.random() < 0.4
        body = self._body(op, stream=stream)
        op.bills("keyed call completed")
        original = await self.keyed(op, body, headers)
        if original is None:
            return
        await asyncio.sleep(self.rng.random() * 2)
        again = await self.keyed(op, body, headers)
        if again is None:
            return
        if again.replayed != "true":
            op.defects.append(f"duplicate after completion not replayed ({again.replayed})")
        if _payload(again.body, stream) != _payload(original.body, stream):
            op.defects.append("duplicate after completion got a different answer")

    async def _op_mismatch(self, op: Op) -> None:
        self._new_key(op)
        headers = op.headers
        body = self._body(op, stream=False)
        op.bills("keyed call completed")
        original = await self.keyed(op, body, headers)
        if original is None:
            return
        other = self._body(op, stream=False, text=f"soak {op.id} a different question")
        assert op.key is not None
        for _ in range(20):
            attempt = await self.send(self._url(), other, {**headers, "Idempotency-Key": op.key})
            op.attempts.append(attempt)
            if attempt.outcome not in ("refused",) and not attempt.outcome.startswith("broken:"):
                break
            await asyncio.sleep(0.3)
        if attempt.outcome != "problem:fingerprint-mismatch":
            op.defects.append(f"same key, different body: {attempt.outcome}, not 422")
        again = await self.keyed(op, body, headers)
        if again is not None and again.body != original.body:
            op.defects.append("the original record changed after a mismatch")

    async def _op_leave(self, op: Op) -> None:
        # The client gives up mid-request; the gateway finishes and stores, the retry
        # (after asking the status endpoint) gets it without a second bill.
        self._new_key(op)
        assert op.key is not None
        headers = op.headers
        slow = {**headers, "X-Sim-Delay-Ms": "600"}
        body = self._body(op, stream=False)
        op.bills("keyed call completed")
        url = self._url()
        left = await self.send(url, body, {**slow, "Idempotency-Key": op.key}, timeout=0.15)
        op.attempts.append(left)
        await self.status(url, op.key, headers, wait=5)
        await self.keyed(op, body, slow)

    async def _op_leave_stream(self, op: Op) -> None:
        self._new_key(op)
        assert op.key is not None
        headers = op.headers
        paced = {**headers, "X-Sim-Token-Ms": "30"}
        body = self._body(op, stream=True)
        op.bills("keyed call completed")
        left = await self.send(
            self._url(), body, {**paced, "Idempotency-Key": op.key}, leave_after_events=2
        )
        op.attempts.append(left)
        await self.keyed(op, body, paced)

    async def status(
        self, url: str, key: str, headers: dict[str, str], wait: float = 0
    ) -> dict[str, Any] | None:
        """The key's record from ``/_payonce/requests/{key}`` (None: 404 or unreachable)."""
        assert self._pooled is not None
        query = f"?wait={wait:g}" if wait else ""
        try:
            async with self._pooled.get(
                f"{url}/_payonce/requests/{key}{query}",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=wait + 10),
            ) as response:
                data = await response.read()
                if response.status == 200:
                    return dict(orjson.loads(data))
                return None
        except (aiohttp.ClientError, TimeoutError):
            return None

    # -- unkeyed calls ------------------------------------------------------------

    async def _unkeyed(self, op: Op, *, stream: bool, extra: dict[str, str] | None = None) -> None:
        headers = {**self.rng.choice(TENANTS), **(extra or {})}
        url = op.pinned or self._url()
        attempt = await self.send(url, self._body(op, stream=stream), headers, fresh=True)
        op.attempts.append(attempt)
        if attempt.outcome == "ok":
            op.bills("unkeyed call answered")
        elif attempt.outcome.startswith("upstream:") or attempt.outcome == "refused":
            op.reasons["unkeyed call refused before any work"] += 1
        elif self._in_restart(attempt):
            # Cut by the gateway's restart: the upstream may or may not have finished it.
            op.bills("unkeyed call cut by the restart", 0, 1)
        else:
            op.defects.append(f"unkeyed call: {attempt.outcome} {attempt.body[:300]!r}")

    async def _op_unkeyed(self, op: Op) -> None:
        await self._unkeyed(op, stream=False)

    async def _op_unkeyed_stream(self, op: Op) -> None:
        await self._unkeyed(op, stream=True)

    async def _op_slow_unkeyed(self, op: Op) -> None:
        await self._unkeyed(op, stream=False, extra={"X-Sim-Delay-Ms": "1500"})

    async def _op_unkeyed_leave(self, op: Op) -> None:
        # --on-disconnect cancel: the gateway cancels, but a non-streaming provider bills
        # a generation that it had started (docs/gateway.md, Disconnects).
        headers = {**self.rng.choice(TENANTS), "X-Sim-Delay-Ms": "600"}
        body = self._body(op, stream=False)
        attempt = await self.send(self._url(), body, headers, fresh=True, timeout=0.15)
        op.attempts.append(attempt)
        op.bills("unkeyed call left mid-request (provider may bill it)", 0, 1)

    async def _op_unkeyed_leave_stream(self, op: Op) -> None:
        # The gateway cancels the upstream stream; the simulator, as a provider, goes on
        # generating and bills it (docs/sim.md, Streaming).
        headers = {**self.rng.choice(TENANTS), "X-Sim-Token-Ms": "30"}
        body = self._body(op, stream=True)
        attempt = await self.send(self._url(), body, headers, fresh=True, leave_after_events=2)
        op.attempts.append(attempt)
        if attempt.outcome == "left":
            op.bills("unkeyed stream left mid-stream (provider bills it)")
        elif attempt.outcome.startswith("upstream:") or attempt.outcome == "refused":
            op.reasons["unkeyed call refused before any work"] += 1
        else:
            op.bills("unkeyed stream cut otherwise", 0, 1)
            if not self._in_restart(attempt):
                op.defects.append(f"unkeyed stream: {attempt.outcome}")


def _payload(body: bytes, stream: bool) -> bytes:
    """What two answers to one key must share: the body, or a stream's data lines."""
    if not stream:
        return body
    return b"\n".join(line for line in body.split(b"\n") if line.startswith(b"data:"))
