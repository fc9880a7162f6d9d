"""SSE splitting, numbering and usage capture, as pure functions."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from payonce.gateway.sse import (
    EventSplitter,
    LastEventId,
    StreamUsage,
    ask_for_usage,
    failed_in_band,
    is_event_stream,
    read_last_event_id,
    relayed,
    run_tag,
)

EVENTS = [b'data: {"a":1}\n\n', b"event: ping\ndata: {}\n\n", b": comment\n\n", b"data: [DONE]\n\n"]


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_events_come_out_whole_however_the_chunks_fall(cuts: list[int]) -> None:
    stream = b"".join(EVENTS)
    splitter, out, position = EventSplitter(), [], 0
    for cut in cuts:
        out += splitter.feed(stream[position : position + cut])
        position += cut
    out += splitter.feed(stream[position:])
    out += splitter.close()
    assert out == EVENTS


@pytest.mark.parametrize(
    "chunk",
    [
        *(b"a", b"ab", b"\n\n", b"\n\nx\n\n", b"x\n\n", b"x\n\n\n", b"x\r\n\n", b"x\n\ny", b"x\n"),
        # The first LF two bytes from the end, the last byte not an LF; two lines
        # (Anthropic's shape) told by the blank-line search; a blank line inside.
        *(b"data: x\ny", b"event: a\ndata: b\n\n", b"a\nb\n\nc\n\n", b"a\n\nb\nc\n\n"),
    ],
)
def test_a_chunk_that_looks_like_one_event_splits_as_byte_by_byte(chunk: bytes) -> None:
    # A read of one whole event takes a shortcut (EventSplitter.feed): the same
    # events as the byte-at-a-time path, and the same rest at the close.
    whole, by_byte = EventSplitter(), EventSplitter()
    one = whole.feed(chunk) + whole.feed(b"data: next\n\n") + whole.close()
    other = [event for byte in chunk for event in by_byte.feed(bytes([byte]))]
    other += by_byte.feed(b"data: next\n\n") + by_byte.close()
    assert one == other


def test_crlf_events_and_an_unterminated_tail() -> None:
    splitter = EventSplitter()
    assert splitter.feed(b"data: 1\r\n\r\ndata: 2") == [b"data: 1\r\n\r\n"]
    assert splitter.close() == [b"data: 2\n\n"]


def test_relayed_puts_the_id_with_its_run_last() -> None:
    assert relayed(b"data: x\n\n", 7, b"3fa94c1e") == b"data: x\nid: 7-3fa94c1e\n\n"
    assert relayed(b"data: x\r\n\r\n", 8, b"00ff00ff") == b"data: x\r\nid: 8-00ff00ff\r\n\r\n"
    anthropic = b'event: ping\ndata: {"type":"ping"}\n\n'
    assert relayed(anthropic, 3, b"3fa94c1e") == anthropic[:-1] + b"id: 3-3fa94c1e\n\n"


def test_relayed_sends_a_comment_as_its_bare_lines() -> None:
    assert relayed(b": OPENROUTER PROCESSING\n\n", 2, b"3fa94c1e") == b": OPENROUTER PROCESSING\n"
    assert relayed(b":\r\n: ping\r\n\r\n", 2, b"3fa94c1e") == b":\n: ping\n"
    # "data" is a field only as a whole name: "database:" is an unknown field, kept bare.
    assert relayed(b"database: x\n\n", 2, b"3fa94c1e") == b"database: x\n"
    assert relayed(b": c\ndata\n\n", 2, b"3fa94c1e") == b": c\ndata\nid: 2-3fa94c1e\n\n"


def test_a_run_tag_is_8_hex_digits_of_the_token_and_only_its_own() -> None:
    tag = run_tag("00112233445566ff")
    assert len(tag) == 8 and int(tag, 16) >= 0
    assert tag == run_tag("00112233445566ff") != run_tag("00112233445566fe")
    assert tag not in (b"00112233", b"445566ff"), "a hash, not a piece of the token"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"12-3fa94c1e", LastEventId(12, b"3fa94c1e")),
        (b" 12-3FA94C1E ", LastEventId(12, b"3fa94c1e")),
        (b"0-3fa94c1e", LastEventId(0, b"3fa94c1e")),
        (b"12", LastEventId(12, None)),
        (b"0", LastEventId(0, None)),
        (b"-1", None),
        (b"12-3fa94c1", None),
        (b"12-3fa94c1e0", None),
        (b"seven", None),
        (b"1" * 19, None),
    ],
)
def test_read_last_event_id(raw: bytes, expected: LastEventId | None) -> None:
    assert read_last_event_id(raw) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("text/event-stream", True),
        ("text/event-stream; charset=utf-8", True),
        ("application/json", False),
        (None, False),
    ],
)
def test_is_event_stream(value: str | None, expected: bool) -> None:
    assert is_event_stream(value) is expected


def test_openai_usage_chunk_is_captured_and_flagged() -> None:
    usage = StreamUsage()
    chunk = b'data: {"id":"c","model":"gpt-4o-mini","choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
    final = b'data: {"id":"c","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}\n\n'
    assert usage.inspect(chunk) is False
    assert usage.inspect(final) is True
    assert usage.model == "gpt-4o-mini"
    assert usage.usage == {"input_tokens": 5, "output_tokens": 7}


def test_only_the_first_usage_of_an_event_decides_whether_it_is_parsed() -> None:
    # A null first usage skips the parse (every chunk but the last, once usage was
    # asked for); a first one that is not null parses the event, null ones after it
    # or not (a search for any "usage":null anywhere would have skipped this one).
    usage = StreamUsage()
    assert usage.inspect(b'data: {"model":"m","usage":null,"x":"usage"}\n\n') is False
    assert usage.usage is None
    final = (
        b'data: {"usage":{"prompt_tokens":2,"completion_tokens":3},"choices":[{"usage":null}]}\n\n'
    )
    usage.inspect(final)
    assert usage.usage == {"input_tokens": 2, "output_tokens": 3}


def test_litellm_usage_chunk_with_an_empty_choice_is_flagged() -> None:
    # What the LiteLLM proxy (1.108.7) relays for OpenAI's choices: [] usage chunk.
    usage = StreamUsage()
    finish = b'data: {"id":"c","model":"m","choices":[{"finish_reason":"stop","index":0,"delta":{}}]}\n\n'
    final = b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":1,"completion_tokens":16,"cost":9.75e-6}}\n\n'
    assert usage.inspect(finish) is False
    assert usage.inspect(final) is True
    # The cost the proxy states is kept (observe/pricing.py prices the call by it).
    assert usage.usage == {"input_tokens": 1, "output_tokens": 16, "provider_cost_nano_usd": 9750}
    # A choice that still says something keeps its chunk, usage or not.
    for choice in (
        {"index": 0, "delta": {"content": "hi"}},
        {"index": 0, "delta": {}, "finish_reason": "stop"},
        {"index": 0, "text": "hi"},
        {"index": 0, "delta": {}, "logprobs": {"content": []}},
        {"index": 0, "delta": {}, "refusal": None},
    ):
        chunk = {"id": "c", "choices": [choice], "usage": {"prompt_tokens": 1}}
        assert StreamUsage().inspect(b"data: " + orjson.dumps(chunk) + b"\n\n") is False, choice


def test_anthropic_usage_from_message_start_and_delta() -> None:
    usage = StreamUsage()
    start = {
        "type": "message_start",
        "message": {
            "model": "claude-sonnet-4-0",
            "usage": {"input_tokens": 12, "output_tokens": 1},
        },
    }
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 30},
    }
    assert usage.inspect(b"event: message_start\ndata: " + orjson.dumps(start) + b"\n\n") is False
    assert usage.inspect(b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n") is False
    assert usage.model == "claude-sonnet-4-0"
    assert usage.usage == {"input_tokens": 12, "output_tokens": 30}


def _responses_event(kind: str, response: dict[str, object]) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": 0, "response": response})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


@pytest.mark.parametrize("final", ["response.completed", "response.incomplete"])
def test_responses_api_model_and_usage_from_the_lifecycle_events(final: str) -> None:
    usage = StreamUsage()
    created = _responses_event("response.created", {"model": "gpt-4o-mini", "usage": None})
    delta = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n'
    tokens = {"input_tokens": 8, "output_tokens": 20, "output_tokens_details": {}}
    last = _responses_event(final, {"model": "gpt-4o-mini", "usage": tokens})
    assert usage.inspect(created) is False
    assert usage.model == "gpt-4o-mini"
    assert usage.inspect(delta) is False
    assert usage.usage is None
    assert usage.inspect(last) is False, "never stripped: it is the response itself"
    assert usage.usage == {"input_tokens": 8, "output_tokens": 20}


def test_ask_for_usage_only_when_missing() -> None:
    body = orjson.dumps({"model": "m", "stream": True, "messages": []})
    changed = ask_for_usage("/v1/chat/completions", body)
    assert changed is not None and orjson.loads(changed)["stream_options"] == {
        "include_usage": True
    }
    asked = orjson.dumps({"stream": True, "stream_options": {"include_usage": True}})
    assert ask_for_usage("/v1/chat/completions", asked) is None
    assert ask_for_usage("/v1/chat/completions", orjson.dumps({"stream": False})) is None
    assert ask_for_usage("/v1/messages", body) is None
    assert ask_for_usage("/v1/chat/completions", b"not json") is None


def test_ask_for_usage_sees_a_stream_spelled_with_escapes() -> None:
    # The shortcut that skips parsing bodies without "stream" must not miss this one.
    body = b'{"model":"m","str\\u0065am":true,"messages":[]}'
    changed = ask_for_usage("/v1/chat/completions", body)
    assert changed is not None and orjson.loads(changed)["stream_options"] == {
        "include_usage": True
    }
    assert ask_for_usage("/v1/chat/completions", b'{"model":"m","messages":[]}') is None


@pytest.mark.parametrize(
    ("event", "failed"),
    [
        (b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n', True),
        (b'data: {"id":"x","error":{"code":"server_error"},"choices":[]}\n\n', True),
        (b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"error"}]}\n\n', True),
        (b'data: {"type":"error","code":"server_error","message":"boom"}\n\n', True),
        (b'data: {"choices":[{"delta":{"content":"an \\"error\\": {}"}}]}\n\n', False),
        (b'data: {"choices":[{"delta":{"content":"event: error"}}]}\n\n', False),
        (b'data: {"error":null,"choices":[]}\n\n', False),
        (b'event: ping\ndata: {"type":"ping"}\n\n', False),
    ],
)
def test_an_error_sent_as_an_event_is_told_from_text_that_mentions_one(
    event: bytes, failed: bool
) -> None:
    assert failed_in_band(event) is failed
