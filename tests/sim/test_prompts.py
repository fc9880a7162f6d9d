"""Request parsing and the token formulas (documented in payonce.sim.prompts)."""

from __future__ import annotations

from typing import Any

import pytest

from payonce.sim.prompts import (
    MAX_ANSWER_TOKENS,
    MIN_ANSWER_TOKENS,
    answer_tokens,
    estimate_tokens,
    parse_chat,
    parse_completion,
    parse_embedding,
    parse_message,
)
from payonce.sim.provider_errors import BadRequest


def chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.parametrize(("chars", "tokens"), [(0, 0), (1, 1), (4, 1), (5, 2), (18, 5), (400, 100)])
def test_estimate_is_ceil_of_a_quarter(chars: int, tokens: int) -> None:
    assert estimate_tokens(chars) == tokens


def test_answer_is_the_input_clamped_then_capped() -> None:
    assert answer_tokens(5, None) == (MIN_ANSWER_TOKENS, False)
    assert answer_tokens(100, None) == (100, False)
    assert answer_tokens(10_000, None) == (MAX_ANSWER_TOKENS, False)
    assert answer_tokens(100, 20) == (20, True)
    assert answer_tokens(100, 100) == (100, False)


def test_chat_counts_every_message_text() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "a" * 40},
            {
                "role": "user",
                "content": [{"type": "text", "text": "b" * 40}, {"type": "image_url"}],
            },
            {"role": "assistant", "content": None, "tool_calls": []},
        ],
    }
    ask = parse_chat(body)
    assert (ask.model, ask.input_tokens, ask.answer_tokens, ask.truncated) == (
        "gpt-4o",
        20,
        20,
        False,
    )
    assert ask.output_tokens == 20


def test_chat_max_tokens_and_n() -> None:
    ask = parse_chat(chat("x" * 400, max_tokens=30, n=3))
    assert (ask.input_tokens, ask.answer_tokens, ask.truncated, ask.choices) == (100, 30, True, 3)
    assert ask.output_tokens == 90
    # max_completion_tokens is the newer name and wins.
    assert parse_chat(chat("x" * 400, max_tokens=30, max_completion_tokens=50)).answer_tokens == 50


def test_completions_default_to_16_tokens_and_one_choice_per_prompt() -> None:
    ask = parse_completion({"model": "gpt-3.5-turbo-instruct", "prompt": "y" * 400})
    assert (ask.input_tokens, ask.answer_tokens, ask.truncated) == (100, 16, True)
    ask = parse_completion(
        {"model": "m", "prompt": ["abcd", "abcdefgh"], "max_tokens": 100, "n": 2}
    )
    assert (ask.input_tokens, ask.answer_tokens, ask.choices) == (3, 16, 4)
    assert parse_completion({"model": "m", "prompt": [1, 2, 3, 4, 5]}).input_tokens == 5
    assert parse_completion({"model": "m", "prompt": [[1, 2], [3]]}).choices == 2


def test_embeddings() -> None:
    ask = parse_embedding({"model": "text-embedding-3-small", "input": ["abcd", "abcdefgh"]})
    assert (ask.input_tokens, ask.output_tokens, ask.choices, ask.dimensions) == (3, 0, 2, 1536)
    assert not ask.base64
    large = parse_embedding(
        {"model": "text-embedding-3-large", "input": "hi", "encoding_format": "base64"}
    )
    assert (large.dimensions, large.base64) == (3072, True)
    assert parse_embedding({"model": "m", "input": "hi", "dimensions": 256}).dimensions == 256


def test_anthropic_counts_system_and_messages() -> None:
    ask = parse_message(
        {
            "model": "claude-sonnet-4-0",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": "s" * 40}],
            "messages": [
                {"role": "user", "content": "u" * 40},
                {"role": "assistant", "content": [{"type": "text", "text": "a" * 40}]},
            ],
        }
    )
    assert (ask.input_tokens, ask.answer_tokens, ask.truncated) == (30, 30, False)
    assert parse_message(
        {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x" * 400}]}
    ).truncated


def test_a_stream_is_sized_like_the_same_request_without_it() -> None:
    plain = parse_chat(chat("x" * 100, max_tokens=20, n=2))
    streamed = parse_chat(
        chat("x" * 100, max_tokens=20, n=2, stream=True, stream_options={"include_usage": True})
    )
    assert (plain.stream, plain.include_usage) == (False, False)
    assert (streamed.stream, streamed.include_usage) == (True, True)
    sizes = ("input_tokens", "answer_tokens", "output_tokens", "truncated", "choices")
    assert [getattr(streamed, name) for name in sizes] == [getattr(plain, name) for name in sizes]

    assert parse_chat(chat("x", stream=True)).include_usage is False
    assert parse_chat(chat("x", stream=True, stream_options={})).include_usage is False
    assert parse_chat(chat("x", stream=False, stream_options=None)).stream is False
    completion = parse_completion(
        {"model": "m", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    )
    assert (completion.stream, completion.include_usage) == (True, True)
    message = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert parse_message({**message, "stream": True}).stream is True
    assert parse_message(message).stream is False


def test_same_body_same_usage() -> None:
    assert parse_chat(chat("retry me")) == parse_chat(chat("retry me"))


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (parse_chat, [], None),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}]}, "model"),
        (parse_chat, {"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model"),
        (parse_chat, {"model": "m"}, "messages"),
        (parse_chat, {"model": "m", "messages": []}, "messages"),
        (parse_chat, {"model": "m", "messages": ["hi"]}, "messages[0]"),
        (parse_chat, {"model": "m", "messages": [{"content": "x"}]}, "messages[0]"),
        (parse_chat, chat(42), "messages[0].content"),
        (parse_chat, chat("x", max_tokens=0), "max_tokens"),
        (parse_chat, chat("x", max_tokens="5"), "max_tokens"),
        (parse_chat, chat("x", max_tokens=True), "max_tokens"),
        (parse_chat, chat("x", n=1000), "n"),
        (parse_chat, chat("x", stream="true"), "stream"),
        (parse_chat, chat("x", stream_options={"include_usage": True}), "stream_options"),
        (parse_completion, {"model": "m", "prompt": "x", "stream": 1}, "stream"),
        (
            parse_message,
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user"}], "stream": "on"},
            "stream",
        ),
        (parse_completion, {"model": "m"}, "prompt"),
        (parse_completion, {"model": "m", "prompt": ""}, "prompt"),
        (parse_completion, {"model": "m", "prompt": [1, "a"]}, "prompt"),
        (parse_embedding, {"model": "m"}, "input"),
        (parse_embedding, {"model": "m", "input": []}, "input"),
        (
            parse_embedding,
            {"model": "m", "input": "x", "encoding_format": "hex"},
            "encoding_format",
        ),
        (parse_embedding, {"model": "m", "input": "x", "dimensions": 5000}, "dimensions"),
        (
            parse_message,
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
        ),
        (parse_message, {"model": "m", "max_tokens": 5}, "messages"),
        (
            parse_message,
            {"model": "m", "max_tokens": 5, "messages": [{"role": "system"}]},
            "messages.0",
        ),
    ],
)
def test_bad_bodies_are_bad_requests(parse: Any, body: Any, param: str | None) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(body)
    assert caught.value.param == param
    assert caught.value.message
