"""Stream events, in process: shapes, one delta per output token, text and usage as in the JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from payonce.sim.bodies import answer_text, anthropic_message, chat_completion, text_completion
from payonce.sim.prompts import Ask, parse_chat, parse_completion, parse_message
from payonce.sim.streams import (
    DONE,
    EventStream,
    chat_completion_stream,
    message_stream,
    text_completion_stream,
)

ID = "chatcmpl-0123456789abcdef01234567"
CREATED = 1_700_000_000


def frames(stream: EventStream) -> list[tuple[str | None, str]]:
    """Each event as (event name or None, data), checking the framing on the way."""
    parsed = []
    for raw in stream:
        text = raw.decode()
        assert text.endswith("\n\n")
        assert "\n\n" not in text[:-2]
        name = None
        lines = text[:-2].split("\n")
        if lines[0].startswith("event: "):
            name = lines.pop(0).removeprefix("event: ")
        [data] = lines
        assert data.startswith("data: ")
        parsed.append((name, data.removeprefix("data: ")))
    return parsed


def openai_chunks(stream: EventStream) -> list[dict[str, Any]]:
    events = frames(stream)
    assert events[-1] == (None, "[DONE]")
    assert all(name is None for name, _ in events)
    return [json.loads(data) for _, data in events[:-1]]


def chat(content: str = "x" * 40, **extra: Any) -> Ask:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": content}], **extra}
    return parse_chat({**body, "stream": True})


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream(include_usage: bool) -> None:
    ask = chat(stream_options={"include_usage": include_usage})
    stream = chat_completion_stream(ask, ID, CREATED)
    chunks = openai_chunks(stream)
    assert stream.count == len(chunks) + 1
    assert stream.tokens == ask.output_tokens == 16
    if include_usage:
        *chunks, usage = chunks
        assert usage["choices"] == []
        assert usage["usage"] == json.loads(chat_completion(ask, ID, CREATED))["usage"]
    for chunk in chunks:
        assert chunk["id"] == ID
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["created"] == CREATED
        assert chunk["model"] == "gpt-4o"
        assert chunk["system_fingerprint"] == "fp_payonce_sim"
        if include_usage:
            assert chunk["usage"] is None
        else:
            assert "usage" not in chunk
    first, *deltas, last = (chunk["choices"] for chunk in chunks)
    assert first == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": "", "refusal": None},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert len(deltas) == ask.output_tokens
    assert all(choice["finish_reason"] is None for [choice] in deltas)
    text = "".join(choice["delta"]["content"] for [choice] in deltas)
    body = json.loads(chat_completion(ask, ID, CREATED))
    assert text == body["choices"][0]["message"]["content"] == answer_text(16)
    assert last == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]


def test_chat_stream_with_n_interleaves_the_choices() -> None:
    ask = chat(n=3, max_tokens=5)
    chunks = openai_chunks(chat_completion_stream(ask, ID, CREATED))
    assert all(len(chunk["choices"]) == 1 for chunk in chunks)
    choices = [chunk["choices"][0] for chunk in chunks]
    roles, deltas, finishes = choices[:3], choices[3:-3], choices[-3:]
    assert [(c["index"], c["delta"].get("role")) for c in roles] == [
        (0, "assistant"),
        (1, "assistant"),
        (2, "assistant"),
    ]
    assert len(deltas) == ask.output_tokens == 15
    assert [c["index"] for c in deltas[:6]] == [0, 1, 2, 0, 1, 2]
    for index in range(3):
        text = "".join(c["delta"]["content"] for c in deltas if c["index"] == index)
        assert text == answer_text(5)
    assert [(c["index"], c["finish_reason"]) for c in finishes] == [
        (0, "length"),
        (1, "length"),
        (2, "length"),
    ]


def test_text_completion_stream() -> None:
    ask = parse_completion(
        {
            "model": "gpt-3.5-turbo-instruct",
            "prompt": ["abcd", "efgh"],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    stream = text_completion_stream(ask, "cmpl-1", CREATED)
    *chunks, usage = openai_chunks(stream)
    body = json.loads(text_completion(ask, "cmpl-1", CREATED))
    assert usage["usage"] == body["usage"]
    assert usage["choices"] == []
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    assert all(chunk["usage"] is None for chunk in chunks)
    *deltas, finish_0, finish_1 = [chunk["choices"][0] for chunk in chunks]
    assert len(deltas) == ask.output_tokens == 8
    assert all(set(d) == {"text", "index", "logprobs", "finish_reason"} for d in deltas)
    for index in (0, 1):
        text = "".join(d["text"] for d in deltas if d["index"] == index)
        assert text == body["choices"][index]["text"]
    assert finish_0 == {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
    assert finish_1["index"] == 1


def test_anthropic_message_stream() -> None:
    ask = parse_message(
        {
            "model": "claude-sonnet-4-0",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "u" * 80}],
            "stream": True,
        }
    )
    stream = message_stream(ask, "msg_1", CREATED)
    events = [(name, json.loads(data)) for name, data in frames(stream)]
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 10,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    body = json.loads(anthropic_message(ask, "msg_1", CREATED))
    start = events[0][1]["message"]
    assert start == {
        **body,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 1},
    }
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == body["content"][0]["text"]
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"output_tokens": body["usage"]["output_tokens"]},
    }
    assert stream.tail[-1] == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def test_tokens_are_the_content_events_only() -> None:
    stream = chat_completion_stream(chat(max_tokens=3), ID, CREATED)
    assert [stream.is_token(index) for index in range(stream.count)] == [
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    assert stream.tail[-1] == DONE
    assert list(stream) == [stream.event(index) for index in range(stream.count)]


def test_the_longest_answer_streams_every_token() -> None:
    ask = chat("x" * 100_000)
    stream = chat_completion_stream(ask, ID, CREATED)
    assert stream.tokens == 1024
    text = "".join(
        chunk["choices"][0]["delta"].get("content", "") for chunk in openai_chunks(stream)
    )
    assert text == answer_text(1024)


def test_model_names_are_json_escaped() -> None:
    ask = chat(max_tokens=1)
    odd = Ask('gpt-"4o"\n', ask.input_tokens, 1, True, stream=True)
    chunks = openai_chunks(chat_completion_stream(odd, ID, CREATED))
    assert {chunk["model"] for chunk in chunks} == {'gpt-"4o"\n'}
    [(_, start), *_] = frames(message_stream(odd, "msg_1", CREATED))
    assert json.loads(start)["message"]["model"] == 'gpt-"4o"\n'
