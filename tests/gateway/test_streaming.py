"""Streams through the gateway: recorded, followed, resumed, and never paid twice."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Iterator

import anthropic
import httpx2 as httpx
import openai
import pytest

from tests.gateway.conftest import AUTH, GatewayFactory, Sim, module_gateway
from tests.support.processes import Process
from tests.support.sse import read_stream
from tests.support.waiting import settled_record

MESSAGES = [{"role": "user", "content": "Tell me a long story about retries and invoices."}]
SLOW = {"X-Sim-Token-Ms": "20"}  # 20 ms per token: a stream of a couple of seconds
STREAM_BODY = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 60, "stream": True}


@pytest.fixture(scope="module")
def gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """One default gateway for the module: every test uses keys no other test does
    (uuids), counts only the simulator's ledger (emptied by ``fresh_sim``) and waits
    for its streams to end (completed, or billed by the simulator) before it returns.
    Tests that need flags start their own gateway with ``start_gateway``."""
    yield from module_gateway(sim, tmp_path_factory)


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0)


def stream_text(client: openai.OpenAI, key: str | None = None, **extra: object) -> str:
    headers = dict(SLOW)
    if key:
        headers["Idempotency-Key"] = key
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=60,
        stream=True,
        extra_headers=headers,
        **extra,
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def wait_completed(
    gateway: Process, key: str, headers: dict[str, str] | None = None
) -> dict[str, object]:
    doc = settled_record(gateway.url, key, headers or AUTH)
    assert doc["state"] == "completed", doc
    return dict(doc)


def wait_billed(sim: Sim) -> None:
    """Until the simulator has billed a generation (it finishes streams nobody reads)."""
    deadline = time.monotonic() + 15
    while sim.billed() == 0 and time.monotonic() < deadline:
        time.sleep(0.1)


def third_event_id(gateway: Process, key: str) -> str:
    """The id of event 3 of a stream, as a second client following it live reads it."""
    headers = {**AUTH, **SLOW, "Idempotency-Key": key}
    read = read_stream(gateway.url + "/v1/chat/completions", STREAM_BODY, headers, stop_after=3)
    return read.events[2].id


def raw_events(
    url: str,
    key: str | None,
    headers: dict[str, str] | None = None,
    body: dict[str, object] | None = None,
) -> list[bytes]:
    """The raw SSE events of one streamed request, split on blank lines."""
    sent = {**AUTH, **SLOW, **(headers or {})}
    if key:
        sent["Idempotency-Key"] = key
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body or STREAM_BODY, headers=sent, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        data = b"".join(response.iter_bytes())
    return [event + b"\n\n" for event in data.split(b"\n\n") if event]


def test_openai_stream_dropped_after_three_chunks_is_finished_by_the_retry(
    gateway: Process, fresh_sim: Sim
) -> None:
    reference = stream_text(sdk(fresh_sim.url))
    fresh_sim.reset()
    client = sdk(gateway.url)
    key = f"story-{uuid.uuid4()}"
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=60,
        stream=True,
        extra_headers={**SLOW, "Idempotency-Key": key},
    )
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    stream.close()  # the client gives up mid-stream
    assert stream_text(client, key) == reference
    wait_completed(gateway, key, {"Authorization": "Bearer sk-test"})
    assert fresh_sim.billed() == 1


def test_anthropic_stream_dropped_midway_is_finished_by_the_retry(
    gateway: Process, fresh_sim: Sim
) -> None:
    def text(base_url: str, key: str | None) -> str:
        client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant", max_retries=0)
        headers = {**SLOW, **({"Idempotency-Key": key} if key else {})}
        with client.messages.stream(
            model="claude-sonnet-4-20250514",
            max_tokens=60,
            messages=MESSAGES,
            extra_headers=headers,
        ) as stream:
            return "".join(stream.text_stream)

    reference = text(fresh_sim.url, None)
    fresh_sim.reset()
    key = f"claude-{uuid.uuid4()}"
    client = anthropic.Anthropic(base_url=gateway.url, api_key="sk-ant", max_retries=0)
    with client.messages.stream(
        model="claude-sonnet-4-20250514",
        max_tokens=60,
        messages=MESSAGES,
        extra_headers={**SLOW, "Idempotency-Key": key},
    ) as stream:
        for _, _piece in zip(range(3), stream.text_stream, strict=False):
            pass
    assert text(gateway.url, key) == reference
    doc = wait_completed(gateway, key, {"x-api-key": "sk-ant"})
    assert fresh_sim.billed() == 1
    entry = fresh_sim.ledger()["entries"][0]
    assert doc["usage"]["output_tokens"] == entry["output_tokens"]
    assert doc["usage"]["input_tokens"] == entry["input_tokens"]


def test_two_clients_on_one_live_stream_get_identical_events(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = f"live-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        early = pool.submit(raw_events, gateway.url, key)
        time.sleep(0.5)  # the late one joins mid-stream
        late = pool.submit(raw_events, gateway.url, key)
        assert early.result() == late.result()
    events = early.result()
    assert events[-1].startswith(b"data: [DONE]\nid: ")
    ids = [e.rsplit(b"id: ", 1)[1] for e in events]
    run = ids[0][ids[0].index(b"-") :]
    assert ids == [b"%d%s" % (n, run) for n in range(1, len(events) + 1)]
    assert fresh_sim.billed() == 1


def test_a_completed_stream_replays_byte_for_byte(gateway: Process, fresh_sim: Sim) -> None:
    key = f"replay-{uuid.uuid4()}"
    first = raw_events(gateway.url, key)
    wait_completed(gateway, key)
    assert raw_events(gateway.url, key) == first
    assert fresh_sim.billed() == 1


def _event_id(event: bytes) -> str:
    return event.rsplit(b"id: ", 1)[1].strip().decode()


def test_last_event_id_resumes_after_that_event(gateway: Process, fresh_sim: Sim) -> None:
    key = f"resume-{uuid.uuid4()}"
    full = raw_events(gateway.url, key)
    tail = raw_events(gateway.url, key, {"Last-Event-ID": _event_id(full[4])})
    assert tail == full[5:]
    live_key = f"resume-live-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        original = pool.submit(raw_events, gateway.url, live_key)
        # Event 3's id names the run: a second client of the running stream reads it.
        third = third_event_id(gateway, live_key)
        live_tail = raw_events(gateway.url, live_key, {"Last-Event-ID": third})
        assert live_tail == original.result()[3:]
    bad = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=STREAM_BODY,
        headers={**AUTH, "Idempotency-Key": key, "Last-Event-ID": "x"},
    )
    assert bad.status_code == 400


def test_a_stream_whose_upstream_dies_is_not_stored_and_the_retry_runs_again(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = f"dies-{uuid.uuid4()}"
    with pytest.raises(httpx.HTTPError):
        raw_events(gateway.url, key, {"X-Sim-Die-After": "5"})
    assert httpx.get(f"{gateway.url}/_payonce/requests/{key}", headers=AUTH).status_code == 404
    retry = raw_events(gateway.url, key)
    assert retry[-1].startswith(b"data: [DONE]")
    ledger = fresh_sim.ledger()
    assert ledger["requests"] == 2
    assert ledger["billed"] == 1, "the broken generation was not billed; the retry was"


def test_status_reports_a_running_streams_progress(gateway: Process, fresh_sim: Sim) -> None:
    key = f"progress-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # 60 tokens 50 ms apart: 3 s or more in progress, asked about until it ends
        # (a fixed number of asks could all come before a slow start).
        pending = pool.submit(raw_events, gateway.url, key, {"X-Sim-Token-Ms": "50"})
        seen: list[int] = []
        while not pending.done():
            doc = httpx.get(f"{gateway.url}/_payonce/requests/{key}", headers=AUTH).json()
            if doc.get("state") == "in_progress" and doc.get("events"):
                seen.append(doc["events"])
            time.sleep(0.05)
        events = pending.result()
    # Progress before the end; at most every event while its completion is written
    # (the end waits for events the store has not taken yet).
    assert seen and min(seen) < len(events) and max(seen) <= len(events)
    assert wait_completed(gateway, key)["events"] == len(events)


def test_usage_is_known_even_when_the_client_did_not_ask(gateway: Process, fresh_sim: Sim) -> None:
    key = f"usage-{uuid.uuid4()}"
    events = raw_events(gateway.url, key)
    assert not any(b'"choices":[]' in event for event in events), "the usage chunk is stripped"
    doc = wait_completed(gateway, key)
    entry = fresh_sim.ledger()["entries"][0]
    assert doc["usage"] == {
        "input_tokens": entry["input_tokens"],
        "output_tokens": entry["output_tokens"],
    }
    assert doc["cost_usd"] == pytest.approx(entry["cost_usd"])
    asked = raw_events(
        gateway.url,
        f"asked-{uuid.uuid4()}",
        body={**STREAM_BODY, "stream_options": {"include_usage": True}},
    )
    assert any(b'"choices":[]' in event for event in asked), "a client that asked gets its chunk"


def test_usage_injection_can_be_turned_off(start_gateway: GatewayFactory, fresh_sim: Sim) -> None:
    gateway = start_gateway("--no-inject-stream-usage")
    key = f"no-usage-{uuid.uuid4()}"
    raw_events(gateway.url, key)
    assert wait_completed(gateway, key)["usage"] is None


def test_an_unkeyed_stream_is_cancelled_upstream_when_its_client_leaves(
    gateway: Process, fresh_sim: Sim
) -> None:
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json=STREAM_BODY,
        headers={**AUTH, **SLOW},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        for _, _chunk in zip(range(2), response.iter_raw(), strict=False):
            pass
    # The provider goes on generating (and bills it), but nobody is connected.
    wait_billed(fresh_sim)
    assert fresh_sim.ledger()["entries"][0]["client_connected"] is False


def test_a_keyed_stream_is_read_to_the_end_when_its_client_leaves(
    gateway: Process, fresh_sim: Sim
) -> None:
    key = f"kept-{uuid.uuid4()}"
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json=STREAM_BODY,
        headers={**AUTH, **SLOW, "Idempotency-Key": key},
        timeout=30,
    ) as response:
        for _, _chunk in zip(range(2), response.iter_raw(), strict=False):
            pass
    wait_completed(gateway, key)
    assert fresh_sim.ledger()["entries"][0]["client_connected"] is True


def test_on_stream_disconnect_cancel_stops_a_keyed_stream_nobody_reads(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--on-stream-disconnect", "cancel")
    key = f"cancel-{uuid.uuid4()}"
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json=STREAM_BODY,
        headers={**AUTH, **SLOW, "Idempotency-Key": key},
        timeout=30,
    ) as response:
        for _, _chunk in zip(range(2), response.iter_raw(), strict=False):
            pass
    wait_billed(fresh_sim)
    # The provider still finishes (and bills) what it started, but nobody was reading,
    # and the key was released: a retry runs again instead of waiting for the rest.
    assert fresh_sim.ledger()["entries"][0]["client_connected"] is False
    assert httpx.get(f"{gateway.url}/_payonce/requests/{key}", headers=AUTH).status_code == 404
