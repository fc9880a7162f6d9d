"""OpenAI's Responses API (``/v1/responses``) from a real ``payonce sim``, through the openai SDK.

Whole and streamed answers parsed into the SDK's typed models, stored responses read
back with ``GET /v1/responses/{id}``, background responses polled to completion, and
the same billing, latency, faults and pacing as chat.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx2 as httpx
import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from payonce.sim.bodies import answer_text
from payonce.sim.pricing import cost_usd
from tests.sim.conftest import Sim, SimFactory
from tests.sim.test_streaming import UNPACED, stream_raw, wait_for_billed

QUESTION = "What is the capital of France?"  # 30 characters: 8 input tokens, 16 output
BODY: dict[str, Any] = {"model": "gpt-4o-mini", "input": QUESTION}
USAGE_REPORT = "/v1/organization/usage/completions"
ADMIN = {"Authorization": "Bearer sk-admin-test"}

EVENT_TYPES = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * 16,
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def client(
    sim: Sim, headers: dict[str, str] | None = None, api_key: str = "sk-test"
) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=sim.url + "/v1",
        api_key=api_key,
        max_retries=0,
        timeout=10,
        default_headers=headers if headers is not None else UNPACED,
    )


def only_entry(sim: Sim) -> dict[str, Any]:
    ledger = sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)
    return dict(ledger["entries"][0])


# --- whole responses -----------------------------------------------------------------


def test_the_sdk_creates_a_response(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        raw = sdk.responses.with_raw_response.create(model="gpt-4o-mini", input=QUESTION)
    response = raw.parse()
    assert isinstance(response, Response)
    assert re.fullmatch("resp_[0-9a-f]{24}", response.id)
    assert raw.headers["x-request-id"] == response.id == response._request_id
    assert (response.object, response.status, response.model) == (
        "response",
        "completed",
        "gpt-4o-mini",
    )
    assert abs(response.created_at - time.time()) < 60
    assert response.completed_at is not None and response.completed_at >= response.created_at
    [message] = response.output
    assert message.type == "message"
    assert (message.role, message.status) == ("assistant", "completed")
    assert message.id.startswith("msg_")
    assert response.output_text == answer_text(16)
    usage = response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (8, 16, 24)
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert (response.error, response.incomplete_details, response.background) == (None, None, False)
    entry = only_entry(fresh_sim)
    assert entry["endpoint"] == "/v1/responses"
    assert entry["provider_request_id"] == response.id
    assert (entry["input_tokens"], entry["output_tokens"]) == (8, 16)
    assert entry["cost_usd"] == pytest.approx(cost_usd("gpt-4o-mini", 8, 16))
    assert entry["client_connected"] is True


def test_input_items_and_instructions_are_counted_as_input(fresh_sim: Sim) -> None:
    items: Any = [
        {"role": "user", "content": "x" * 40},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "y" * 40}]},
    ]
    with client(fresh_sim) as sdk:
        response = sdk.responses.create(
            model="gpt-4o",
            input=items,
            instructions="z" * 20,
            metadata={"order": "42"},
            user="customer-7",
        )
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (25, 25)
    assert response.instructions == "z" * 20
    assert response.metadata == {"order": "42"}
    entry = only_entry(fresh_sim)
    assert entry["user"] == "customer-7"


def test_max_output_tokens_cuts_the_answer_short(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        response = sdk.responses.create(model="gpt-4o-mini", input="x" * 400, max_output_tokens=20)
        with pytest.raises(openai.BadRequestError) as too_small:
            sdk.responses.create(model="gpt-4o-mini", input=QUESTION, max_output_tokens=8)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.max_output_tokens == 20
    assert response.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert response.usage is not None and response.usage.output_tokens == 20
    assert too_small.value.param == "max_output_tokens"
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (2, 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "gpt-4o"}, "input"),
        ({"input": "hi"}, "model"),
        ({"model": "gpt-4o", "input": []}, "input"),
        ({"model": "gpt-4o", "input": 7}, "input"),
        ({**BODY, "store": "yes"}, "store"),
        ({**BODY, "background": 1}, "background"),
        ({**BODY, "stream": "true"}, "stream"),
        ({**BODY, "metadata": {"a": 1}}, "metadata"),
    ],
)
def test_bad_requests_are_refused_unbilled(fresh_sim: Sim, body: Any, param: str) -> None:
    response = fresh_sim.post("/v1/responses", body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert fresh_sim.ledger()["billed"] == 0


# --- streams ---------------------------------------------------------------------


def test_the_sdk_streams_typed_events(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        stream = sdk.responses.create(model="gpt-4o-mini", input=QUESTION, stream=True)
        with stream:
            events = list(stream)
        whole = sdk.responses.create(model="gpt-4o-mini", input=QUESTION)
    assert [event.type for event in events] == EVENT_TYPES
    assert [event.sequence_number for event in events] == list(range(len(EVENT_TYPES)))
    created, in_progress, added, part_added = events[:4]
    *deltas, text_done, part_done, item_done, completed = events[4:]
    assert isinstance(created, ResponseCreatedEvent)
    assert isinstance(in_progress, ResponseInProgressEvent)
    assert isinstance(added, ResponseOutputItemAddedEvent)
    assert isinstance(part_added, ResponseContentPartAddedEvent)
    assert all(isinstance(delta, ResponseTextDeltaEvent) for delta in deltas)
    assert isinstance(text_done, ResponseTextDoneEvent)
    assert isinstance(part_done, ResponseContentPartDoneEvent)
    assert isinstance(item_done, ResponseOutputItemDoneEvent)
    assert isinstance(completed, ResponseCompletedEvent)

    response_id = stream.response.headers["x-request-id"]
    assert created.response.id == completed.response.id == response_id
    assert (created.response.status, created.response.usage) == ("in_progress", None)
    assert created.response.output == []
    item_id = added.item.id
    assert {d.item_id for d in deltas} == {item_id, text_done.item_id, item_done.item.id}
    text = "".join(d.delta for d in deltas if isinstance(d, ResponseTextDeltaEvent))
    assert text == text_done.text == whole.output_text == completed.response.output_text
    assert completed.response.status == "completed"
    assert completed.response.usage == whole.usage

    streamed, unstreamed = fresh_sim.ledger()["entries"]
    assert streamed["provider_request_id"] == response_id
    for field in ("input_tokens", "output_tokens", "cost_usd", "model", "endpoint"):
        assert streamed[field] == unstreamed[field]
    assert streamed["endpoint"] == "/v1/responses"


def test_the_sdk_stream_helper_builds_the_final_response(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk, sdk.responses.stream(**BODY) as stream:
        text = "".join(
            event.delta for event in stream if event.type == "response.output_text.delta"
        )
        final = stream.get_final_response()
    assert final.output_text == text == answer_text(16)
    assert final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == 16


def test_a_stream_cut_by_max_output_tokens_ends_incomplete(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        events = list(
            sdk.responses.create(
                model="gpt-4o-mini", input="x" * 400, max_output_tokens=20, stream=True
            )
        )
    last = events[-1]
    assert isinstance(last, ResponseIncompleteEvent)
    assert last.response.status == "incomplete"
    assert last.response.output_text == answer_text(20)
    assert last.response.usage is not None and last.response.usage.output_tokens == 20
    assert sum(event.type == "response.output_text.delta" for event in events) == 20
    assert only_entry(fresh_sim)["output_tokens"] == 20


async def test_the_async_sdk(fresh_sim: Sim) -> None:
    async with openai.AsyncOpenAI(
        base_url=fresh_sim.url + "/v1", api_key="sk-test", max_retries=0, default_headers=UNPACED
    ) as sdk:
        whole = await sdk.responses.create(model="gpt-4o-mini", input=QUESTION)
        stream = await sdk.responses.create(model="gpt-4o-mini", input=QUESTION, stream=True)
        types = [event.type async for event in stream]
    assert whole.output_text == answer_text(16)
    assert types == EVENT_TYPES
    assert fresh_sim.ledger()["billed"] == 2


def test_stream_wire_format(fresh_sim: Sim) -> None:
    received = stream_raw(fresh_sim, "/v1/responses", {**BODY, "stream": True}, UNPACED)
    assert received.complete
    assert received.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert received.headers["x-request-id"] == only_entry(fresh_sim)["provider_request_id"]
    for event, kind in zip(received.events, EVENT_TYPES, strict=True):
        name, data = event.split(b"\n")
        assert name == b"event: " + kind.encode()
        assert data.startswith(b'data: {"type":"%s","sequence_number":' % kind.encode())
    assert b"[DONE]" not in b"".join(received.events)  # the Responses API sends none


def test_tokens_are_paced_after_the_latency(fresh_sim: Sim) -> None:
    started = time.monotonic()
    headers = {"X-Sim-Delay-Ms": "200", "X-Sim-Token-Ms": "25"}
    received = stream_raw(fresh_sim, "/v1/responses", {**BODY, "stream": True}, headers)
    elapsed = time.monotonic() - started
    assert received.complete
    assert received.first_byte_after >= 0.19
    assert elapsed >= 0.2 + 16 * 0.025 - 0.01


# --- faults ------------------------------------------------------------------------


def test_refused_requests_are_neither_billed_nor_stored(fresh_sim: Sim) -> None:
    with (
        client(fresh_sim, {"X-Sim-Fail": "500"}) as sdk,
        pytest.raises(openai.InternalServerError) as refused,
    ):
        sdk.responses.create(model="gpt-4o-mini", input=QUESTION)
    response_id = refused.value.response.headers["x-request-id"]
    with client(fresh_sim) as sdk, pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response_id)
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 0)


def test_a_stream_that_dies_is_not_billed_and_is_stored_as_failed(fresh_sim: Sim) -> None:
    headers = {"X-Sim-Die-After": "6", "X-Sim-Token-Ms": "5"}
    auth = {"Authorization": "Bearer sk-test"}  # the SDK's, reading it back below
    received = stream_raw(fresh_sim, "/v1/responses", {**BODY, "stream": True}, headers | auth)
    assert not received.complete
    assert len(received.events) == 6
    time.sleep(0.2)
    assert fresh_sim.ledger()["billed"] == 0
    response_id = received.headers["x-request-id"]
    with client(fresh_sim) as sdk:
        failed = sdk.responses.retrieve(response_id)
        with pytest.raises(openai.APIConnectionError):
            list(sdk.responses.create(**BODY, stream=True, extra_headers=headers))
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.code == "server_error"
    assert failed.usage is None


def test_a_dropped_response_was_billed_and_can_be_read_back_by_its_id(fresh_sim: Sim) -> None:
    with (
        client(fresh_sim, {"X-Sim-Drop": "1"}) as sdk,
        pytest.raises(openai.APIConnectionError),
    ):
        sdk.responses.create(model="gpt-4o-mini", input=QUESTION)
    entry = only_entry(fresh_sim)
    with client(fresh_sim) as sdk:
        stored = sdk.responses.retrieve(entry["provider_request_id"])
    assert (stored.status, stored.output_text) == ("completed", answer_text(16))


def test_a_dropped_stream_is_billed_without_its_completed_event(fresh_sim: Sim) -> None:
    received = stream_raw(
        fresh_sim, "/v1/responses", {**BODY, "stream": True}, {"X-Sim-Drop": "1", **UNPACED}
    )
    assert not received.complete
    assert received.events[-1].startswith(b"event: response.output_item.done\n")
    assert only_entry(fresh_sim)["client_connected"] is True


def test_a_client_that_leaves_is_billed_anyway(fresh_sim: Sim) -> None:
    with pytest.raises(httpx.ReadTimeout):
        fresh_sim.post("/v1/responses", BODY, headers={"X-Sim-Delay-Ms": "600"}, timeout=0.2)
    ledger = wait_for_billed(fresh_sim, 1)
    assert ledger["billed"] == 1
    assert ledger["entries"][0]["client_connected"] is False


# --- stored responses ----------------------------------------------------------------


def test_a_stored_response_reads_back_byte_for_byte(fresh_sim: Sim) -> None:
    created = fresh_sim.post("/v1/responses", BODY, headers={"Authorization": "Bearer sk-a"})
    response_id = created.json()["id"]
    read = httpx.get(
        f"{fresh_sim.url}/v1/responses/{response_id}", headers={"Authorization": "Bearer sk-a"}
    )
    assert read.status_code == 200
    assert read.content == created.content
    assert created.json()["store"] is True
    assert fresh_sim.ledger()["requests"] == 1, "a read is not a generation request"


def test_a_streamed_response_is_stored_as_its_completed_event_says(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        events = list(sdk.responses.create(**BODY, stream=True))
        completed = events[-1]
        assert isinstance(completed, ResponseCompletedEvent)
        stored = sdk.responses.retrieve(completed.response.id)
    assert stored == completed.response


def test_store_false_and_other_projects_cannot_read_it(fresh_sim: Sim) -> None:
    with client(fresh_sim, api_key="sk-a") as sdk:
        unstored = sdk.responses.create(**BODY, store=False)
        stored = sdk.responses.create(**BODY)
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.responses.retrieve(unstored.id)
    with client(fresh_sim, api_key="sk-b") as other, pytest.raises(openai.NotFoundError):
        other.responses.retrieve(stored.id)
    assert unstored.output_text == stored.output_text
    assert missing.value.body == {
        "message": f"Response with id '{unstored.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert fresh_sim.ledger()["billed"] == 2


def test_only_the_newest_stored_responses_are_kept(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:0", "--stored-responses", "2")
    with client(sim) as sdk:
        ids = [sdk.responses.create(**BODY).id for _ in range(3)]
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(ids[0])
        assert [sdk.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


def test_retrieving_as_a_stream_is_not_modelled(fresh_sim: Sim) -> None:
    response_id = fresh_sim.post("/v1/responses", BODY).json()["id"]
    read = httpx.get(f"{fresh_sim.url}/v1/responses/{response_id}", params={"stream": "true"})
    assert read.status_code == 400
    assert read.json()["error"]["param"] == "stream"


# --- background responses ------------------------------------------------------------


def test_a_background_response_is_polled_to_completion_and_billed_once(fresh_sim: Sim) -> None:
    with client(fresh_sim, {"X-Sim-Delay-Ms": "2000"}) as sdk:
        queued = sdk.responses.create(**BODY, background=True)
        # Answered before the generation (2 s) ended: nothing billed yet.
        assert fresh_sim.ledger()["billed"] == 0
        statuses = [queued.status]
        polled = queued
        deadline = time.monotonic() + 10
        while polled.status in ("queued", "in_progress") and time.monotonic() < deadline:
            time.sleep(0.05)
            polled = sdk.responses.retrieve(queued.id)
            statuses.append(polled.status)
    assert queued.status == "queued"
    assert (queued.background, queued.output, queued.usage) == (True, [], None)
    assert "in_progress" in statuses
    assert polled.status == "completed"
    assert polled.output_text == answer_text(16)
    assert polled.created_at == queued.created_at
    assert polled.usage is not None and polled.usage.output_tokens == 16
    entry = only_entry(fresh_sim)
    assert entry["provider_request_id"] == queued.id
    assert entry["client_connected"] is False, "nobody waits on a background generation"


def test_a_background_response_is_stored_even_with_store_false(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        queued = sdk.responses.create(**BODY, background=True, store=False)
        wait_for_billed(fresh_sim, 1)
        done = sdk.responses.retrieve(queued.id)
    assert done.status == "completed"


def test_a_streamed_background_response_streams_and_is_stored(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        events = list(sdk.responses.create(**BODY, background=True, stream=True))
        completed = events[-1]
        assert isinstance(completed, ResponseCompletedEvent)
        assert completed.response.background is True
        assert sdk.responses.retrieve(completed.response.id) == completed.response
    assert fresh_sim.ledger()["billed"] == 1


# --- the admin usage report ------------------------------------------------------------


def test_responses_count_as_completions_usage(fresh_sim: Sim) -> None:
    with client(fresh_sim) as sdk:
        sdk.responses.create(**BODY)
        list(sdk.responses.create(**BODY, stream=True))
    report = httpx.get(
        fresh_sim.url + USAGE_REPORT,
        params={"start_time": int(time.time()) - 3600, "bucket_width": "1h"},
        headers=ADMIN,
    ).json()
    found = [result for bucket in report["data"] for result in bucket["results"]]
    assert sum(r["num_model_requests"] for r in found) == 2
    assert sum(r["input_tokens"] for r in found) == 16
    assert sum(r["output_tokens"] for r in found) == 32
