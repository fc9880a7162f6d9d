"""A stream's holder killed mid-stream: a ``Last-Event-ID`` resume on another replica.

Two gateways on one SQLite file. Gateway A runs a keyed stream and is SIGKILLed
part-way; the client resumes the standard SSE way on gateway B. B used to take
the key over once A's lease lapsed and relay a new generation from event N+1 on:
events 1-N of one generation glued to the rest of another (issue 29, defect 4).
B must answer from A's run only (what A recorded, then a broken stream when its
lease lapses) or refuse with 412 ``stream-not-resumable``; a request without
``Last-Event-ID`` then starts over.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx2 as httpx

from tests.replicas.conftest import AUTH, Gateways
from tests.support.sim import Sim
from tests.support.sse import Read, completion_ids, read_stream
from tests.support.waiting import wait_until

BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    # 200 characters: a 50-token answer (53 events with [DONE]), 50 ms apart.
    "messages": [
        {"role": "user", "content": "Tell me a long story about replicas. " * 5 + "x" * 15}
    ],
    "max_tokens": 60,
    "stream": True,
}


def _stream(url: str, key: str, *, stop_after: int | None = None, **headers: str) -> Read:
    sent = {**AUTH, "X-Sim-Token-Ms": "50", "Idempotency-Key": key, **headers}
    return read_stream(url + "/v1/chat/completions", BODY, sent, stop_after=stop_after)


def _state(url: str, key: str) -> str:
    answer = httpx.get(f"{url}/_payonce/requests/{key}", headers=AUTH, timeout=10)
    return str(answer.json().get("state", answer.status_code))


def _same_run_or_refused(resumed: Read, first: Read) -> None:
    if resumed.status == 412:
        assert json.loads(resumed.body)["type"].endswith("problems.md#stream-not-resumable")
        assert resumed.headers["x-should-retry"] == "false"
        return
    assert resumed.status == 200, resumed.body[:300]
    assert completion_ids(resumed.events) <= completion_ids(first.events), "a splice"
    numbers = [int(event.id.split("-")[0]) for event in resumed.events]
    after = int(first.last_event_id.split("-")[0])
    assert numbers == list(range(after + 1, after + 1 + len(numbers))), "no event skipped"


def test_a_resume_on_another_replica_after_the_holder_was_killed_is_never_spliced(
    start_gateways: Gateways, fresh_sim: Sim, tmp_path: Path
) -> None:
    a, b = start_gateways(2, "--lease", "1s", store=f"sqlite:///{tmp_path}/shared.db")
    key = f"killed-stream-{uuid.uuid4()}"
    first = _stream(a.url, key, stop_after=10)
    assert first.status == 200 and len(first.events) >= 10
    os.kill(a.popen.pid, signal.SIGKILL)
    # At once, while A's lease may still run: what A recorded of its run, then a
    # broken stream once the lease lapses; or, if it already lapsed, 412.
    soon = _stream(b.url, key, **{"Last-Event-ID": first.last_event_id})
    _same_run_or_refused(soon, first)
    if soon.status == 200:
        assert soon.broken, "A's run cannot end: A is dead"
    wait_until(lambda: _state(b.url, key) == "abandoned", "A's lease to lapse")
    late = _stream(b.url, key, **{"Last-Event-ID": first.last_event_id})
    _same_run_or_refused(late, first)
    assert late.status == 412, "A's run is gone"
    assert fresh_sim.requests() == 1, "no resume started a generation"
    # Starting over is the client's decision: without Last-Event-ID, B runs it again.
    again = _stream(b.url, key)
    assert again.status == 200 and not again.broken and again.events[-1].data == "[DONE]"
    assert completion_ids(again.events).isdisjoint(completion_ids(first.events))
    _same_run_or_refused(_stream(b.url, key, **{"Last-Event-ID": first.last_event_id}), first)
    assert fresh_sim.requests() == 2
