"""``Last-Event-ID`` resumes one run of a keyed stream, never a splice of two.

When the upstream dies mid-stream the key is released. A client that then
resumed the standard SSE way (``Last-Event-ID: 20``) started a new generation,
had its first 20 events skipped, and got events 21... of generation B after
events 1-20 of generation A: two completion ids, two texts glued (issue 29,
defect 4). An event id now names its run (``id: <n>-<run>``); a resume is
answered from that run only, live or recorded, or refused with 412
``stream-not-resumable``. The other replica's case is in tests/replicas.

A real simulator and gateway; raw HTTP with a standard SSE decoder as the
client; the simulator's ledger says what ran and what was billed.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest

from tests.gateway.conftest import AUTH, Sim, module_gateway
from tests.support.processes import Process
from tests.support.sse import Read, completion_ids, read_stream

BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    # 200 characters: a 50-token answer, cut to 40 tokens (43 events with [DONE])
    "messages": [
        {"role": "user", "content": "Tell me a long story about retries. " * 5 + "x" * 20}
    ],
    "max_tokens": 40,
    "stream": True,
}
SLOW = {"X-Sim-Token-Ms": "20"}
EVENT_ID = re.compile(r"(\d+)-([0-9a-f]{8})")


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One default gateway for the module: every test uses keys no other test does
    (uuids), counts only the simulator's ledger (emptied by ``fresh_sim``) and reads
    its streams to their end before it returns."""
    yield from module_gateway(sim, tmp_path_factory)


def _stream(gateway: Process, key: str, **headers: str) -> Read:
    sent = {**AUTH, **SLOW, "Idempotency-Key": key, **headers}
    return read_stream(gateway.url + "/v1/chat/completions", BODY, sent)


def _wait_completed(gateway: Process, key: str) -> None:
    url = f"{gateway.url}/_payonce/requests/{key}?wait=30"
    assert httpx.get(url, headers=AUTH, timeout=40).json()["state"] == "completed"


def _refused(read: Read) -> None:
    assert read.status == 412, read.body[:300]
    assert read.headers["content-type"] == "application/problem+json"
    assert read.headers["x-should-retry"] == "false"
    assert json.loads(read.body)["type"].endswith("problems.md#stream-not-resumable")


def test_every_event_id_names_its_number_and_its_run(gateway: Process, fresh_sim: Sim) -> None:
    events = _stream(gateway, f"ids-{uuid.uuid4()}").events
    matches = [EVENT_ID.fullmatch(event.id) for event in events]
    assert all(matches), [event.id for event in events]
    assert [int(m[1]) for m in matches if m] == list(range(1, len(events) + 1))
    assert len({m[2] for m in matches if m}) == 1, "one run"
    other = _stream(gateway, f"ids-{uuid.uuid4()}").events
    assert other[0].id.split("-")[1] != events[0].id.split("-")[1], "another key, another run"


def test_a_resume_after_the_upstream_died_is_refused_not_spliced(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = f"died-{uuid.uuid4()}"
    first = _stream(gateway, key, **{"X-Sim-Die-After": "20"})
    assert first.broken and len(first.events) == 20
    [first_id] = completion_ids(first.events)
    resumed = _stream(gateway, key, **{"Last-Event-ID": first.last_event_id})
    if resumed.status == 200:
        assert completion_ids(resumed.events) <= {first_id}, "a splice of two generations"
    _refused(resumed)
    assert fresh_sim.requests() == 1, "the resume started no generation"
    # Starting over is the client's decision: a request without Last-Event-ID runs.
    again = _stream(gateway, key)
    assert not again.broken and again.events[-1].data == "[DONE]"
    assert len(completion_ids(again.events)) == 1
    assert (fresh_sim.requests(), fresh_sim.billed()) == (2, 1)


def test_a_resume_with_the_id_of_a_replaced_run_is_refused(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = f"replaced-{uuid.uuid4()}"
    dead = _stream(gateway, key, **{"X-Sim-Die-After": "10"})
    assert dead.broken
    whole = _stream(gateway, key)  # run B, to its end
    _wait_completed(gateway, key)
    assert completion_ids(whole.events).isdisjoint(completion_ids(dead.events))
    _refused(_stream(gateway, key, **{"Last-Event-ID": dead.last_event_id}))
    # B's own ids resume B, from the store.
    tail = _stream(gateway, key, **{"Last-Event-ID": whole.events[9].id})
    assert tail.status == 200 and tail.events == whole.events[10:]
    assert (fresh_sim.requests(), fresh_sim.billed()) == (2, 1)


def test_a_resume_continues_its_own_run_live_and_recorded(gateway: Process, fresh_sim: Sim) -> None:
    key = f"resume-{uuid.uuid4()}"
    url = gateway.url + "/v1/chat/completions"
    headers = {**AUTH, "X-Sim-Token-Ms": "50", "Idempotency-Key": key}
    start = read_stream(url, BODY, headers, stop_after=5)  # then the client hangs up
    head = start.events
    live = _stream(gateway, key, **{"Last-Event-ID": start.last_event_id})
    assert live.status == 200 and live.headers["idempotent-replayed"] == "true"
    assert not live.broken and live.events[-1].data == "[DONE]"
    assert completion_ids(head + live.events) == completion_ids(head), "one run"
    _wait_completed(gateway, key)
    whole = _stream(gateway, key).events
    assert head + live.events == whole
    stored = _stream(gateway, key, **{"Last-Event-ID": start.last_event_id})
    assert stored.events == live.events
    assert [event.id for event in stored.events] == [event.id for event in whole[len(head) :]]
    assert (fresh_sim.requests(), fresh_sim.billed()) == (1, 1)


def test_a_last_event_id_without_a_run_is_refused_unless_it_is_zero(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = f"plain-{uuid.uuid4()}"
    whole = _stream(gateway, key)
    _wait_completed(gateway, key)
    # A plain number (an id of an older gateway) cannot say which run it counted.
    _refused(_stream(gateway, key, **{"Last-Event-ID": "5"}))
    _refused(_stream(gateway, f"plain-new-{uuid.uuid4()}", **{"Last-Event-ID": "5"}))
    # 0: nothing received yet, so nothing to splice: the request as without it.
    assert _stream(gateway, key, **{"Last-Event-ID": "0"}).events == whole.events
    bad = _stream(gateway, key, **{"Last-Event-ID": "x"})
    assert bad.status == 400 and json.loads(bad.body)["type"].endswith("#invalid-key")
    assert (fresh_sim.requests(), fresh_sim.billed()) == (1, 1)
