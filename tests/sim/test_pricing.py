"""Cost: per-million input and output prices, prefix matching, a default for unknown models."""

from __future__ import annotations

import pytest

from payonce.sim.pricing import DEFAULT_PRICE, PRICES, Price, cost_usd, price_for


def test_cost_formula() -> None:
    # gpt-4o: $2.50 per million input tokens, $10.00 per million output tokens.
    assert cost_usd("gpt-4o", 1_000_000, 0) == pytest.approx(2.50)
    assert cost_usd("gpt-4o", 0, 1_000_000) == pytest.approx(10.00)
    assert cost_usd("gpt-4o", 5, 16) == pytest.approx((5 * 2.50 + 16 * 10.00) / 1e6)
    assert cost_usd("claude-sonnet-4-0", 1000, 500) == pytest.approx((1000 * 3 + 500 * 15) / 1e6)
    assert cost_usd("text-embedding-3-small", 1000, 0) == pytest.approx(0.00002)


def test_no_float_noise() -> None:
    assert repr(cost_usd("gpt-4o-mini", 3, 7)) == repr(round((3 * 0.15 + 7 * 0.60) / 1e6, 12))


def test_longest_prefix_wins() -> None:
    assert price_for("gpt-4o-2024-08-06") == PRICES["gpt-4o"]
    assert price_for("gpt-4o-mini-2024-07-18") == PRICES["gpt-4o-mini"]
    assert price_for("gpt-4.1-nano") == PRICES["gpt-4.1-nano"]


def test_unknown_models_use_the_default() -> None:
    assert price_for("my-own-llama") == DEFAULT_PRICE == Price(1.00, 4.00)
    assert cost_usd("my-own-llama", 1_000_000, 1_000_000) == pytest.approx(5.00)


def test_every_listed_price_is_sane() -> None:
    for name, price in PRICES.items():
        assert price.input_per_million > 0, name
        assert price.output_per_million >= 0, name


def test_claude_sonnet_4_5_and_its_snapshot_at_3_and_15() -> None:
    """Not the default price: $3 / $15 per million input / output tokens, as listed."""
    for model in ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929"):
        assert price_for(model) == Price(3.00, 15.00)
        assert cost_usd(model, 1000, 500) == pytest.approx((1000 * 3 + 500 * 15) / 1e6)
