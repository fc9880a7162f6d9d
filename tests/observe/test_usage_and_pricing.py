"""Usage read from provider bodies, and the cost it implies."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from payonce.gateway.observing import UpstreamFacts
from payonce.observe.metrics import Metrics, model_label
from payonce.observe.pricing import (
    PRICES,
    USUAL_MODELS,
    cost_of,
    price_of,
    priced,
    priced_call,
    priced_name,
)
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


def test_responses_api_usage_details() -> None:
    body = {
        "model": "gpt-4.1",
        "usage": {
            "input_tokens": 100,
            "output_tokens": 40,
            "input_tokens_details": {"cached_tokens": 30},
            "output_tokens_details": {"reasoning_tokens": 10},
        },
    }
    assert model_and_usage(json.dumps(body).encode(), [])[1] == {
        "input_tokens": 100, "output_tokens": 40, "cached_input_tokens": 30, "reasoning_tokens": 10,
    }  # fmt: skip


def test_responses_api_stream_usage_comes_from_response_completed() -> None:
    from payonce.gateway.sse import StreamUsage

    usage = StreamUsage()
    event = {
        "type": "response.completed",
        "response": {"model": "gpt-4.1", "usage": {"input_tokens": 9, "output_tokens": 3}},
    }
    assert (
        usage.inspect(b"event: response.completed\ndata: " + json.dumps(event).encode() + b"\n\n")
        is False
    )
    assert usage.model == "gpt-4.1"
    assert usage.usage == {"input_tokens": 9, "output_tokens": 3}


def test_a_prices_file_extends_the_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from payonce.observe.pricing import PRICES, install_prices, load_prices

    path = tmp_path / "prices.toml"
    path.write_text(
        '[models."my-finetune"]\ninput = 1.0\noutput = 4.0\nsource = "contract"\nas_of = "2026-11"\n'
    )
    saved = dict(PRICES)
    try:
        install_prices(load_prices(str(path)))
        assert cost_of(
            "my-finetune-v2", {"input_tokens": 1000, "output_tokens": 500}
        ) == pytest.approx(0.003)
        assert price_of("my-finetune").cached_input == 1.0  # type: ignore[union-attr]
    finally:
        PRICES.clear()
        PRICES.update(saved)
        install_prices({})


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("not toml [", "not valid TOML"),
        ("[other]\nx = 1", "no [models] table"),
        ('[models."m"]\ninput = 1', "needs input and output"),
        ('[models."m"]\ninput = "x"\noutput = 1', "must be numbers"),
        ('[models."m"]\ninput = -1\noutput = 1', "must not be negative"),
        ('[models."m"]\ninput = 1\noutput = 1\ncolour = 2', "unknown fields"),
    ],
)
def test_bad_prices_files_are_config_errors(tmp_path, content: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    from payonce.errors import ConfigError
    from payonce.observe.pricing import load_prices

    path = tmp_path / "prices.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_prices(str(path))


@pytest.mark.parametrize(
    ("model", "label"),
    [
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        # Another model (a fine-tune, say) is priced and labelled as none of the table.
        ("gpt-4o-mini-acme-corp-secret-project", "other"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4-0"),  # genai-prices' id of it
        ("llama-3-70b", "other"),
        (None, "other"),
    ],
)
def test_model_labels_are_price_database_names_or_other(model: str | None, label: str) -> None:
    assert model_label(model) == label


def test_a_thousand_made_up_models_make_no_new_series() -> None:
    metrics = Metrics()
    for index in range(1000):
        facts = UpstreamFacts(status=200, model=f"gpt-4o-secret-{index}", cost_usd=0.01)
        metrics.upstream_call(facts)
        metrics.saved_cost_of(f"unknown-{index}").inc(0.01)
    text = metrics.render().decode()
    assert "secret" not in text and "unknown-" not in text
    labels = {
        line.split("{", 1)[1].split("}")[0]
        for line in text.splitlines()
        if line.startswith(("payonce_cost_usd_total", "payonce_saved_cost_usd_total"))
    }
    # The usual models and --prices entries (series from the start, at 0) and other:
    # nothing made up.
    usual = {priced_name(name) for name in USUAL_MODELS} | set(PRICES)
    assert labels == {f'model="{name}"' for name in usual} | {'model="other"'}
    # The children remembered per raw name are bounded too.
    assert len(metrics._costs) <= 256 and len(metrics._saved_costs) <= 256


def test_the_price_database_knows_dated_snapshots_aliases_and_other_providers() -> None:
    same = {
        "gpt-4o-mini-2024-07-18": "gpt-4o-mini",
        "claude-sonnet-4-20250514": "claude-sonnet-4-0",
        "claude-3-5-haiku-20241022": "claude-3-5-haiku-latest",
        "claude-opus-4-5-20251101": "claude-opus-4-5",
    }
    for name, priced_as in same.items():
        assert price_of(name) is price_of(priced_as), name
    # Models the hand-kept table never had, from thousands in genai-prices.
    for name in ("gemini-2.5-pro", "text-embedding-3-small", "amazon.nova-micro-v1:0",
                 "openai/gpt-4o", "deepseek-chat", "gpt-4o-audio-preview"):  # fmt: skip
        price = price_of(name)
        assert price is not None and price.origin == "genai-prices", name
    opus_45, opus_4 = price_of("claude-opus-4-5"), price_of("claude-opus-4")
    assert opus_45 is not None and opus_4 is not None and opus_45.input < opus_4.input
    assert price_of("o3-mini") is not price_of("o3")
    assert price_of("my-finetune") is None and price_of("llama-3-70b-acme") is None


def test_tiered_prices_follow_the_input_tokens() -> None:
    # Gemini 2.5 Pro: $1.25/M input up to 200k input tokens, $2.50/M past them.
    small = priced("gemini-2.5-pro", {"input_tokens": 1000, "output_tokens": 0})[0]
    large = priced("gemini-2.5-pro", {"input_tokens": 300_000, "output_tokens": 0})[0]
    assert small == pytest.approx(1000 * 1.25 / 1e6)
    assert large == pytest.approx(300_000 * 2.5 / 1e6)


def test_each_cost_says_who_priced_it(tmp_path: object) -> None:
    from pathlib import Path

    from payonce.observe.pricing import install_prices, load_prices

    usage = {"input_tokens": 1000, "output_tokens": 100}
    assert priced("gpt-4o", usage) == (pytest.approx((1000 * 2.5 + 100 * 10) / 1e6), "genai-prices")
    assert priced("my-finetune", usage) == (None, None), "unknown: no price, never zero"
    # OpenRouter states the cost of the call in usage.cost: that is what it bills.
    body = {"model": "openai/gpt-4o", "usage": {"prompt_tokens": 1000, "completion_tokens": 100,
                                                "cost": 0.0042}}  # fmt: skip
    model, stated = model_and_usage(json.dumps(body).encode(), [])
    assert priced(model, stated) == (pytest.approx(0.0042), "provider")
    path = Path(str(tmp_path)) / "prices.toml"
    path.write_text('[models."gpt-4o"]\ninput = 1.0\noutput = 2.0\n')
    saved = dict(PRICES)
    try:
        install_prices(load_prices(str(path)))
        assert priced("gpt-4o-2024-08-06", usage) == (pytest.approx(1200 / 1e6), "prices-file")
    finally:
        PRICES.clear()
        PRICES.update(saved)
        install_prices({})


def test_an_openrouter_stream_is_priced_by_its_own_cost() -> None:
    from payonce.gateway.sse import StreamUsage

    stream = StreamUsage()
    final = (
        b'data: {"id":"gen-1","model":"openai/gpt-4o","choices":[],"usage":'
        b'{"prompt_tokens":1000,"completion_tokens":100,"cost":0.00351}}\n\n'
    )
    stream.inspect(final)
    assert priced(stream.model, stream.usage) == (pytest.approx(0.00351), "provider")
    listed, source = priced("openai/gpt-4o", {"input_tokens": 1000, "output_tokens": 100})
    assert source == "genai-prices" and listed == pytest.approx(0.0035), "the list price, checked"


def test_made_up_model_names_do_not_grow_the_price_database_memory() -> None:
    from genai_prices import data_snapshot

    from payonce.observe.pricing import _DATABASE_MEMORY

    snapshot = data_snapshot.get_snapshot()
    for index in range(_DATABASE_MEMORY + 600):
        assert price_of(f"made-up-{index}") is None
    for name in ("_lookup_cache", "_provider_cache", "_provider_misses"):
        assert len(getattr(snapshot, name)) <= _DATABASE_MEMORY + 5, name
    assert price_of("gpt-4o") is not None


def test_a_stated_cost_keeps_the_list_price_beside_it() -> None:
    """priced_call: the list price only when the provider stated the cost (the call log's
    list_cost_usd)."""
    tokens = {"input_tokens": 1000, "output_tokens": 100}
    stated = {**tokens, "provider_cost_nano_usd": 3_510_000}
    cost, source, listed = priced_call("openai/gpt-4o", stated)
    assert (cost, source) == (pytest.approx(0.00351), "provider")
    assert listed == pytest.approx(0.0035)
    assert priced_call("openai/gpt-4o", tokens) == (pytest.approx(0.0035), "genai-prices", None)
    # A stated cost of a model without a list price: no list price, never zero.
    assert priced_call("my-own-llama", stated) == (pytest.approx(0.00351), "provider", None)
    assert priced_call(None, None) == (None, None, None)
