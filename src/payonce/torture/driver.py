"""The clients of a torture run: each call sent on time, over a plain socket, and what came back.

A call is an HTTP/1.1 request made with :mod:`http.client` (no SDK, no retry, no
pooling), so what is recorded is what the wire carried: the status, the headers
the checks need, the body bytes, whether the body ended cleanly (the last chunk
came) or broke, and whether the client hung up on purpose.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import orjson

from payonce.torture.plan import PROMPTS, Call, Plan

__all__ = ["PATHS", "Observation", "body_of", "complete_events_end", "headers_of", "run_calls"]

CREDENTIAL = "sk-torture-tenant"
_READ_TIMEOUT = 90.0
_ID_LINE = re.compile(rb"(?m)^id:\s?([^\r\n]*)")
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


@dataclass
class Observation:
    """What the client of one call saw."""

    call: Call
    started: float = 0.0  # seconds after the run started
    sent_at: float = 0.0  # when it was sent, wall clock (the ledger's clock)
    ended: float = 0.0
    status: int | None = None  # None: no response at all (refused, reset, timed out)
    replayed: str | None = None  # idempotent-replayed
    request_id: str | None = None  # x-payonce-request-id: its call-log line
    upstream_id: str | None = None  # x-request-id: the generation, where the body has no id
    body: bytes = b""
    clean: bool = False  # the body ended as its framing says (last chunk, length, close)
    left: bool = False  # the client hung up on purpose before the end
    left_at: float = 0.0  # when it did, wall clock (the call log's clock)
    error: str | None = None
    last_event_id: str | None = None
    problem: dict[str, Any] | None = None

    @property
    def events(self) -> int:
        return len(_EVENT_END.findall(self.body))


def complete_events_end(body: bytes) -> int:
    """Where the last whole event of an SSE body ends (0: none)."""
    ends = [match.end() for match in _EVENT_END.finditer(body)]
    return ends[-1] if ends else 0


def body_of(call: Call) -> bytes:
    """The request body of ``call`` (every call of a key sends the same, but a mismatch)."""
    prompt = PROMPTS[call.prompt] + (" (a different question)" if call.mismatch else "")
    user = call.key or f"unkeyed-{call.number}"
    if call.api == "embeddings":
        # Base64 vectors of 1536 floats: 8 KiB each, so the answer is large and whole.
        return orjson.dumps(
            {
                "model": "text-embedding-3-small",
                "input": [f"{prompt} ({number})" for number in range(call.inputs)],
                "encoding_format": "base64",
                "user": user,
            }
        )
    if call.api == "messages":
        document: dict[str, Any] = {
            "model": "claude-sonnet-4-0",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": prompt}],
            "metadata": {"user_id": user},
        }
    else:
        document = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": prompt}],
            "user": user,
        }
    if call.stream:
        document["stream"] = True
    return orjson.dumps(document)


def headers_of(call: Call, last_event_id: str | None = None) -> dict[str, str]:
    """The request headers of ``call``: credential, key, the upstream's behaviour."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {CREDENTIAL}"}
    if call.api == "messages":
        headers["x-api-key"] = CREDENTIAL
        headers["anthropic-version"] = "2023-06-01"
    if call.key is not None:
        headers["Idempotency-Key"] = call.key
    # As the Stainless SDKs (openai, anthropic) send on every attempt.
    headers["x-stainless-retry-count"] = str(call.retry)
    headers["X-Sim-Delay-Ms"] = str(call.delay_ms)
    if call.stream:
        headers["X-Sim-Token-Ms"] = str(call.token_ms)
        headers["X-Sim-Wire"] = call.wire
    if call.die_after is not None:
        headers["X-Sim-Die-After"] = str(call.die_after)
    if call.fail is not None:
        headers["X-Sim-Fail"] = str(call.fail)
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "embeddings": "/v1/embeddings"}


def _send(url_port: int, call: Call, observation: Observation, resume_from: str | None) -> None:
    path = PATHS[call.api]
    connection = http.client.HTTPConnection("127.0.0.1", url_port, timeout=_READ_TIMEOUT)
    try:
        connection.request("POST", path, body_of(call), headers_of(call, resume_from))
        if call.leave_after is not None and not call.stream and connection.sock is not None:
            connection.sock.settimeout(call.leave_after)
        response = connection.getresponse()
        observation.status = response.status
        observation.replayed = response.getheader("idempotent-replayed")
        observation.request_id = response.getheader("x-payonce-request-id")
        observation.upstream_id = response.getheader("x-request-id")
        body = bytearray()
        events = 0
        while True:
            piece = response.read1(65536)
            if not piece:
                break
            body += piece
            if call.stream and call.leave_after is not None:
                events = len(_EVENT_END.findall(body))
                if events >= call.leave_after:
                    observation.left = True
                    observation.left_at = time.time()
                    break
        observation.body = bytes(body)
        observation.clean = not observation.left
    except TimeoutError:
        observation.left = call.leave_after is not None
        observation.left_at = time.time()
        observation.error = None if observation.left else "timed out"
    except (OSError, http.client.HTTPException) as exc:
        observation.error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    # The last id of a whole event: one whose blank line did not come was never
    # dispatched, so a client would not resume after it (WHATWG HTML 9.2.6).
    ids = _ID_LINE.findall(observation.body[: complete_events_end(observation.body)])
    if ids:
        observation.last_event_id = ids[-1].decode(errors="replace").strip()
    if observation.status is not None and observation.status >= 400 and observation.body:
        try:
            document = orjson.loads(observation.body)
        except orjson.JSONDecodeError:
            document = None
        observation.problem = document if isinstance(document, dict) else None


def run_calls(
    plan: Plan, ports: list[int], started: float, stop: threading.Event
) -> list[Observation]:
    """Send every call of ``plan`` at its time; return what each client saw, in call order."""
    observations = {call.number: Observation(call) for call in plan.calls}
    done = {call.number: threading.Event() for call in plan.calls}

    def one(call: Call) -> None:
        observation = observations[call.number]
        try:
            resume_from = None
            if call.resume_of is not None:
                done[call.resume_of].wait(_READ_TIMEOUT * 2)
                resume_from = observations[call.resume_of].last_event_id
                if resume_from is None:
                    observation.error = "nothing to resume from"
                    return
            delay = started + call.at - time.monotonic()
            if delay > 0 and stop.wait(delay):
                observation.error = "run stopped"
                return
            observation.started = time.monotonic() - started
            observation.sent_at = time.time()
            _send(ports[call.gateway], call, observation, resume_from)
            observation.ended = time.monotonic() - started
        finally:
            done[call.number].set()

    workers = min(64, max(1, len(plan.calls)))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="torture") as pool:
        futures = [pool.submit(one, call) for call in plan.calls]
        for future in futures:
            future.result()
    return [observations[call.number] for call in plan.calls]
