"""Streams from a real ``payonce sim``: the SDKs, pacing, abandoned streams billed, faults.

Timing assertions are lower bounds only: a slow machine may stretch a stream, never
shorten it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from tests.sim.conftest import CHAT_BODY, Sim, SimFactory

UNPACED = {"X-Sim-Token-Ms": "0"}
STREAM_CHAT: dict[str, Any] = {**CHAT_BODY, "stream": True}  # 5 input tokens, 16 output tokens
# 80 characters: 20 input tokens, so a 20-token answer.
STREAM_CHAT_20: dict[str, Any] = {
    **STREAM_CHAT,
    "messages": [{"role": "user", "content": "twenty tokens. " * 5 + "hello"}],
}
MESSAGE_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-0",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
}
COMPLETION_BODY: dict[str, Any] = {
    "model": "gpt-3.5-turbo-instruct",
    "prompt": "Say hi",
    "max_tokens": 12,
}


@dataclass
class Received:
    """What a raw client got from one stream: the events and whether the body ended cleanly."""

    events: list[bytes]
    complete: bool
    headers: httpx.Headers
    first_byte_after: float  # seconds from sending the request to the response headers

    @property
    def data(self) -> list[str]:
        return [line.decode() for event in self.events for line in event.split(b"\n")]


def stream_raw(sim: Sim, path: str, body: Any, headers: dict[str, str] | None = None) -> Received:
    """POST ``body`` and read the event stream to its end or to a broken connection."""
    events: list[bytes] = []
    buffer = b""
    started = time.monotonic()
    first_byte_after = -1.0
    response_headers = httpx.Headers()
    with httpx.Client(timeout=10) as client:
        try:
            with client.stream("POST", sim.url + path, json=body, headers=headers) as response:
                first_byte_after = time.monotonic() - started
                response_headers = response.headers
                assert response.status_code == 200, response.read()
                for chunk in response.iter_bytes():
                    buffer += chunk
                    *done, buffer = buffer.split(b"\n\n")
                    events.extend(done)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            return Received(events, False, response_headers, first_byte_after)
    assert buffer == b"", "the stream ended in the middle of an event"
    return Received(events, True, response_headers, first_byte_after)


def wait_for_billed(sim: Sim, count: int, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        ledger = sim.ledger()
        if ledger["billed"] >= count or time.monotonic() > deadline:
            return ledger
        time.sleep(0.02)


def openai_client(sim: Sim, headers: dict[str, str] | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=sim.url + "/v1",
        api_key="x",
        max_retries=0,
        timeout=10,
        default_headers=headers if headers is not None else UNPACED,
    )


def anthropic_client(sim: Sim, headers: dict[str, str] | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=sim.url,
        api_key="x",
        max_retries=0,
        timeout=10,
        default_headers=headers if headers is not None else UNPACED,
    )


def assert_clean_log(sim: Sim) -> None:
    log = sim.process.output()
    assert "Traceback" not in log
    assert "Error handling request" not in log


# --- the official SDKs ---------------------------------------------------------------


@pytest.mark.parametrize("include_usage", [False, True])
def test_openai_sdk_streams_a_chat_completion(fresh_sim: Sim, include_usage: bool) -> None:
    messages: Any = [{"role": "user", "content": "What is the capital of France? " * 3}]
    options: Any = {"include_usage": True} if include_usage else openai.omit
    with openai_client(fresh_sim) as client:
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, stream=True, stream_options=options
        )
        with stream:
            chunks = list(stream)
        plain = client.chat.completions.create(model="gpt-4o-mini", messages=messages)

    assert {chunk.id for chunk in chunks} == {stream.response.headers["x-request-id"]}
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    if include_usage:
        *chunks, last = chunks
        assert last.choices == []
        assert last.usage == plain.usage
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason == "stop"
    # One content delta per output token (plus the role chunk and the finish chunk).
    assert plain.usage is not None
    assert len(chunks) == plain.usage.completion_tokens + 2

    streamed, unstreamed = fresh_sim.ledger()["entries"]
    assert streamed["provider_request_id"] == chunks[0].id
    for field in ("input_tokens", "output_tokens", "cost_usd", "model", "endpoint"):
        assert streamed[field] == unstreamed[field]
    assert streamed["client_connected"] is True


def test_openai_sdk_stream_helper_accumulates_the_completion(fresh_sim: Sim) -> None:
    with (
        openai_client(fresh_sim) as client,
        client.chat.completions.stream(
            model="gpt-4o",
            messages=[{"role": "user", "content": "hello there friend"}],
            n=2,
            stream_options={"include_usage": True},
        ) as stream,
    ):
        final = stream.get_final_completion()
    assert [choice.finish_reason for choice in final.choices] == ["stop", "stop"]
    assert final.choices[0].message.content == final.choices[1].message.content
    assert final.choices[0].message.content == (
        "This is a simulated answer from payonce sim; it costs what a rea"
    )
    assert final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (5, 32)
    [entry] = fresh_sim.ledger()["entries"]
    assert entry["output_tokens"] == 32


def test_openai_sdk_streams_a_text_completion(fresh_sim: Sim) -> None:
    with openai_client(fresh_sim) as client:
        chunks = list(
            client.completions.create(
                **COMPLETION_BODY, stream=True, stream_options={"include_usage": True}
            )
        )
        plain = client.completions.create(**COMPLETION_BODY)
    *chunks, last = chunks
    assert last.usage == plain.usage
    assert "".join(chunk.choices[0].text for chunk in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason == "length"
    assert {chunk.object for chunk in chunks} == {"text_completion"}
    streamed, unstreamed = fresh_sim.ledger()["entries"]
    assert streamed["cost_usd"] == unstreamed["cost_usd"]


def test_anthropic_sdk_messages_stream(fresh_sim: Sim) -> None:
    with anthropic_client(fresh_sim) as client:
        with client.messages.stream(**MESSAGE_BODY) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        plain = client.messages.create(**MESSAGE_BODY)
    assert text == final.content[0].text == plain.content[0].text  # type: ignore[union-attr]
    assert final.id.startswith("msg_")
    assert final.stop_reason == plain.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (8, 16)
    assert final.usage == plain.usage
    streamed, unstreamed = fresh_sim.ledger()["entries"]
    assert streamed["provider_request_id"] == final.id
    for field in ("input_tokens", "output_tokens", "cost_usd"):
        assert streamed[field] == unstreamed[field]


def test_anthropic_sdk_create_stream_events(fresh_sim: Sim) -> None:
    with anthropic_client(fresh_sim) as client:
        events = list(client.messages.create(**{**MESSAGE_BODY, "max_tokens": 5}, stream=True))
    # The SDK hides ping; everything else arrives in Anthropic's order.
    assert [event.type for event in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 5,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start, delta = events[0], events[-2]
    assert start.type == "message_start"
    assert (start.message.usage.input_tokens, start.message.usage.output_tokens) == (8, 1)
    assert delta.type == "message_delta"
    assert delta.usage.output_tokens == 5
    assert delta.delta.stop_reason == "max_tokens"


def test_the_sdks_see_refusals_before_the_stream(fresh_sim: Sim) -> None:
    with (
        openai_client(fresh_sim, {"X-Sim-Fail": "429"}) as client,
        pytest.raises(openai.RateLimitError),
    ):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    with (
        anthropic_client(fresh_sim, {"X-Sim-Fail": "529"}) as client,
        pytest.raises(anthropic.InternalServerError),
    ):
        list(client.messages.create(**MESSAGE_BODY, stream=True))
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (2, 0)


# --- the wire format -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "terminator"),
    [
        ("/v1/chat/completions", STREAM_CHAT, b"data: [DONE]"),
        ("/v1/completions", {**COMPLETION_BODY, "stream": True}, b"data: [DONE]"),
        (
            "/v1/messages",
            {**MESSAGE_BODY, "stream": True},
            b'event: message_stop\ndata: {"type":"message_stop"}',
        ),
    ],
)
def test_stream_headers_and_terminator(
    fresh_sim: Sim, path: str, body: Any, terminator: bytes
) -> None:
    received = stream_raw(fresh_sim, path, body, UNPACED)
    assert received.complete
    assert received.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert received.headers["cache-control"] == "no-cache"
    assert (
        received.headers["x-request-id"] == fresh_sim.ledger()["entries"][0]["provider_request_id"]
    )
    assert received.events[-1] == terminator
    assert terminator not in received.events[:-1]


def test_a_thousand_token_stream(fresh_sim: Sim) -> None:
    body = {**STREAM_CHAT, "messages": [{"role": "user", "content": "x" * 4000}]}
    received = stream_raw(fresh_sim, "/v1/chat/completions", body, UNPACED)
    assert received.complete
    assert len(received.events) == 1 + 1000 + 1 + 1  # role, deltas, finish, [DONE]
    [entry] = fresh_sim.ledger()["entries"]
    assert (entry["input_tokens"], entry["output_tokens"]) == (1000, 1000)


# --- pacing ------------------------------------------------------------------------


def test_tokens_are_paced_per_request(fresh_sim: Sim) -> None:
    started = time.monotonic()
    received = stream_raw(
        fresh_sim, "/v1/chat/completions", STREAM_CHAT_20, {"X-Sim-Token-Ms": "50"}
    )
    elapsed = time.monotonic() - started
    assert received.complete
    assert len(received.events) == 23
    assert elapsed >= 0.95  # 20 tokens x 50 ms


def test_the_latency_comes_before_the_first_event(fresh_sim: Sim) -> None:
    headers = {"X-Sim-Delay-Ms": "300", **UNPACED}
    received = stream_raw(fresh_sim, "/v1/messages", {**MESSAGE_BODY, "stream": True}, headers)
    assert received.complete
    assert received.first_byte_after >= 0.29


def test_token_rate_flag(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:0", "--token-rate", "20/s")
    assert "token-rate 20/s" in sim.process.output()
    started = time.monotonic()
    received = stream_raw(sim, "/v1/chat/completions", STREAM_CHAT)  # 16 tokens
    assert received.complete
    assert time.monotonic() - started >= 0.75  # 16 x 50 ms
    # The header overrides the flag; zero means no pacing.
    assert stream_raw(sim, "/v1/chat/completions", STREAM_CHAT, UNPACED).complete


# --- abandoned streams are billed ---------------------------------------------------


def test_a_client_that_leaves_mid_stream_is_billed_when_the_stream_would_have_ended(
    fresh_sim: Sim,
) -> None:
    started = time.monotonic()
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST",
            fresh_sim.url + "/v1/chat/completions",
            json=STREAM_CHAT_20,
            headers={"X-Sim-Token-Ms": "50"},
        ) as response,
    ):
        lines: Iterator[str] = (line for line in response.iter_lines() if line)
        first_three = [next(lines) for _ in range(3)]
    assert all(line.startswith("data: {") for line in first_three)

    assert fresh_sim.ledger()["billed"] == 0, "billed before the generation finished"
    ledger = wait_for_billed(fresh_sim, 1)
    assert time.monotonic() - started >= 0.95  # the whole 20 x 50 ms generation ran
    assert (ledger["requests"], ledger["billed"]) == (1, 1)
    [entry] = ledger["entries"]
    assert entry["client_connected"] is False
    assert entry["output_tokens"] == 20
    time.sleep(0.2)
    assert fresh_sim.ledger()["billed"] == 1
    assert stream_raw(fresh_sim, "/v1/chat/completions", STREAM_CHAT, UNPACED).complete
    assert_clean_log(fresh_sim)


def test_a_client_that_times_out_before_the_first_event_is_billed(fresh_sim: Sim) -> None:
    with pytest.raises(httpx.ReadTimeout):
        fresh_sim.post(
            "/v1/chat/completions",
            STREAM_CHAT,
            headers={"X-Sim-Delay-Ms": "500", **UNPACED},
            timeout=0.1,
        )
    ledger = wait_for_billed(fresh_sim, 1)
    assert ledger["billed"] == 1
    assert ledger["entries"][0]["client_connected"] is False
    assert_clean_log(fresh_sim)


# --- faults --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "die_after"),
    [
        ("/v1/chat/completions", STREAM_CHAT, 3),
        ("/v1/chat/completions", STREAM_CHAT, 0),
        ("/v1/completions", {**COMPLETION_BODY, "stream": True}, 5),
        ("/v1/messages", {**MESSAGE_BODY, "stream": True}, 4),
    ],
)
def test_die_after_truncates_the_stream_and_bills_nothing(
    fresh_sim: Sim, path: str, body: Any, die_after: int
) -> None:
    headers = {"X-Sim-Die-After": str(die_after), "X-Sim-Token-Ms": "10"}
    received = stream_raw(fresh_sim, path, body, headers)
    assert received.headers["content-type"].startswith("text/event-stream")  # a 200 began
    assert not received.complete
    assert len(received.events) == die_after
    time.sleep(0.3)  # longer than the rest of the stream would have taken
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 0)
    assert_clean_log(fresh_sim)


def test_die_after_past_the_end_dies_just_before_the_terminator(fresh_sim: Sim) -> None:
    headers = {"X-Sim-Die-After": "100000", **UNPACED}
    received = stream_raw(fresh_sim, "/v1/messages", {**MESSAGE_BODY, "stream": True}, headers)
    assert not received.complete
    assert received.events[-1].startswith(b"event: message_delta\n")
    assert fresh_sim.ledger()["billed"] == 0


def test_the_sdks_see_a_dead_stream_as_a_connection_error(fresh_sim: Sim) -> None:
    dying = {"X-Sim-Die-After": "4", **UNPACED}
    with openai_client(fresh_sim, dying) as openai_sdk, pytest.raises(openai.APIConnectionError):
        list(
            openai_sdk.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    with (
        anthropic_client(fresh_sim, dying) as anthropic_sdk,
        pytest.raises((anthropic.APIConnectionError, httpx.TransportError)),
        anthropic_sdk.messages.stream(**MESSAGE_BODY) as stream,
    ):
        stream.get_final_message()
    assert fresh_sim.ledger()["billed"] == 0


@pytest.mark.parametrize(
    ("path", "body", "last_seen"),
    [
        (
            "/v1/chat/completions",
            {**STREAM_CHAT, "stream_options": {"include_usage": True}},
            b'"choices":[],"usage":{',
        ),
        ("/v1/messages", {**MESSAGE_BODY, "stream": True}, b"event: message_delta\n"),
    ],
)
def test_drop_bills_the_stream_then_cuts_the_terminator(
    fresh_sim: Sim, path: str, body: Any, last_seen: bytes
) -> None:
    received = stream_raw(fresh_sim, path, body, {"X-Sim-Drop": "1", **UNPACED})
    assert not received.complete
    assert last_seen in received.events[-1]
    ledger = fresh_sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (1, 1)
    assert ledger["entries"][0]["client_connected"] is True
    assert_clean_log(fresh_sim)


def test_non_streaming_requests_ignore_the_stream_headers(fresh_sim: Sim) -> None:
    response = fresh_sim.chat(headers={"X-Sim-Die-After": "0", "X-Sim-Token-Ms": "1000"})
    assert response.status_code == 200
    assert fresh_sim.ledger()["billed"] == 1


def outcomes(sim: Sim, count: int) -> list[tuple[bool, int]]:
    """(complete, events received) of ``count`` unpaced chat streams in a row."""
    return [
        (received.complete, len(received.events))
        for received in (stream_raw(sim, "/v1/chat/completions", STREAM_CHAT) for _ in range(count))
    ]


def test_die_mid_stream_rate_kills_some_streams_unbilled(start_sim: SimFactory) -> None:
    flags = ("--latency", "fixed:0", "--token-rate", "0", "--die-mid-stream", "0.5")
    sim = start_sim(*flags, "--seed", "3")
    seen = outcomes(sim, 40)
    completed = sum(complete for complete, _ in seen)
    # Binomial(40, 0.5): the bounds are more than four standard deviations wide.
    assert 6 <= completed <= 34
    # A dead stream got at least one event and never the terminator ([DONE] is event 19).
    assert all(1 <= events <= 18 for complete, events in seen if not complete)
    assert all(events == 19 for complete, events in seen if complete)
    ledger = sim.ledger()
    assert (ledger["requests"], ledger["billed"]) == (40, completed)
    assert "die-mid-stream 0.5" in sim.process.output()
    assert_clean_log(sim)
    # The same seed kills the same streams at the same events.
    assert outcomes(start_sim(*flags, "--seed", "3"), 40) == seen


def test_drop_after_compute_rate_applies_to_streams(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:0", "--token-rate", "0", "--drop-after-compute", "1")
    received = stream_raw(sim, "/v1/chat/completions", STREAM_CHAT)
    assert not received.complete
    assert received.data[-1].startswith('data: {"id"')
    assert sim.billed() == 1
    kept = stream_raw(sim, "/v1/chat/completions", STREAM_CHAT, {"X-Sim-Drop": "0"})
    assert kept.complete


# --- keep-alive comments ---------------------------------------------------------------

KEEP_ALIVE = b": OPENROUTER PROCESSING"


def test_keep_alive_sends_the_head_at_once_and_comments_while_the_model_thinks(
    fresh_sim: Sim,
) -> None:
    # 500 ms to the first token, a comment every 100 ms of it: exactly 4 (at 100,
    # 200, 300 and 400 ms), however late the machine runs them.
    headers = {"X-Sim-Delay-Ms": "500", "X-Sim-Keep-Alive-Ms": "100", **UNPACED}
    received = stream_raw(fresh_sim, "/v1/chat/completions", STREAM_CHAT, headers)
    assert received.complete
    assert received.events[:4] == [KEEP_ALIVE] * 4
    assert KEEP_ALIVE not in received.events[4:]
    assert received.events[-1] == b"data: [DONE]"
    plain = stream_raw(fresh_sim, "/v1/chat/completions", STREAM_CHAT, {"X-Sim-Delay-Ms": "500"})
    assert received.events[4:] != [] and len(received.events[4:]) == len(plain.events)
    assert KEEP_ALIVE not in b"".join(plain.events), "off unless asked for"


def test_keep_alive_comments_fill_the_gaps_between_slow_tokens(fresh_sim: Sim) -> None:
    # A token every 250 ms, a comment every 100 ms of silence: 2 in each gap.
    headers = {"X-Sim-Delay-Ms": "0", "X-Sim-Keep-Alive-Ms": "100", "X-Sim-Token-Ms": "250"}
    body = {**STREAM_CHAT, "max_tokens": 3}
    received = stream_raw(fresh_sim, "/v1/chat/completions", body, headers)
    kinds = [b"c" if event == KEEP_ALIVE else b"e" for event in received.events]
    # role chunk, then per token two comments and its delta, then finish and [DONE]
    assert b"".join(kinds) == b"e" + b"cce" * 3 + b"ee"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_sdks_ignore_keep_alive_comments(fresh_sim: Sim, api: str) -> None:
    headers = {"X-Sim-Delay-Ms": "300", "X-Sim-Keep-Alive-Ms": "50", "X-Sim-Token-Ms": "120"}
    if api == "openai":
        with openai_client(fresh_sim, headers) as client:
            stream = client.chat.completions.create(
                model="gpt-4o-mini", messages=STREAM_CHAT["messages"], max_tokens=4, stream=True
            )
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
            plain = client.chat.completions.create(
                model="gpt-4o-mini", messages=STREAM_CHAT["messages"], max_tokens=4
            )
        assert text == plain.choices[0].message.content
    else:
        with anthropic_client(fresh_sim, headers) as client:
            body = {**MESSAGE_BODY, "max_tokens": 4}
            with client.messages.stream(**body) as stream:
                text = "".join(stream.text_stream)
            assert text == client.messages.create(**body).content[0].text  # type: ignore[union-attr]


def test_keep_alive_flag_and_a_bad_header(start_sim: SimFactory) -> None:
    sim = start_sim("--latency", "fixed:300ms", "--token-rate", "0", "--keep-alive", "100ms")
    received = stream_raw(sim, "/v1/chat/completions", STREAM_CHAT)
    assert received.events[:2] == [KEEP_ALIVE] * 2
    assert "keep-alive 0.1s" in sim.process.output()
    off = stream_raw(sim, "/v1/chat/completions", STREAM_CHAT, {"X-Sim-Keep-Alive-Ms": "0"})
    assert KEEP_ALIVE not in off.events
    bad = sim.post("/v1/chat/completions", STREAM_CHAT, headers={"X-Sim-Keep-Alive-Ms": "-1"})
    assert bad.status_code == 400 and "X-Sim-Keep-Alive-Ms" in bad.text
