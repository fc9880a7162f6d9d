"""Usage read from provider bodies, and the cost it implies."""

from __future__ import annotations

import gzip
import json

import pytest

from payonce.observe.pricing import cost_of, price_of
from payonce.observe.usage import model_and_usage

OPENAI = {
    "model": "gpt-4o-2024-08-06",
    "usage": {
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "prompt_tokens_details": {"cached_tokens": 400},
        "completion_tokens_details": {"reasoning_tokens": 50},
    },
}
ANTHROPIC = {
    "model": "claude-sonnet-4-20250514",
    "usage": {"input_tokens": 600, "output_tokens": 100, "cache_read_input_tokens": 400},
}


def test_openai_usage_with_cached_and_reasoning_tokens() -> None:
    model, usage = model_and_usage(json.dumps(OPENAI).encode(), [])
    assert model == "gpt-4o-2024-08-06"
    assert usage == {
        "input_tokens": 1000,
        "output_tokens": 200,
        "cached_input_tokens": 400,
        "reasoning_tokens": 50,
    }
    # 600 fresh at $2.50/M + 400 cached at $1.25/M + 200 out at $10/M
    assert cost_of(model, usage) == pytest.approx((600 * 2.5 + 400 * 1.25 + 200 * 10) / 1e6)


def test_anthropic_cache_reads_count_as_input() -> None:
    model, usage = model_and_usage(json.dumps(ANTHROPIC).encode(), [])
    assert usage == {"input_tokens": 1000, "output_tokens": 100, "cached_input_tokens": 400}
    assert cost_of(model, usage) == pytest.approx((600 * 3 + 400 * 0.3 + 100 * 15) / 1e6)


def test_gzip_bodies_are_read() -> None:
    body = gzip.compress(json.dumps(OPENAI).encode())
    assert model_and_usage(body, [("Content-Encoding", "gzip")])[1] is not None
    assert model_and_usage(body, [("Content-Encoding", "br")]) == (None, None)


def test_embeddings_have_no_output_tokens() -> None:
    body = {"model": "text-embedding-3-small", "usage": {"prompt_tokens": 8, "total_tokens": 8}}
    assert model_and_usage(json.dumps(body).encode(), [])[1] == {
        "input_tokens": 8,
        "output_tokens": 0,
    }


@pytest.mark.parametrize("body", [b"", b"[]", b"not json", b'{"usage": "x"}', b'{"usage": {}}'])
def test_bodies_without_usage(body: bytes) -> None:
    assert model_and_usage(body, [])[1] is None


def test_unknown_models_cost_none_not_zero() -> None:
    assert price_of("my-finetune") is None
    assert cost_of("my-finetune", {"input_tokens": 5, "output_tokens": 5}) is None
    assert cost_of(None, {"input_tokens": 5}) is None
    assert price_of("gpt-4o-mini-2024-07-18") is price_of("gpt-4o-mini"), "longest prefix wins"
