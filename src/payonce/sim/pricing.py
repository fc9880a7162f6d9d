"""What the simulated provider charges: a small per-model price table.

Prices are USD per million tokens, input and output, close to the public list
prices of the models they are named after (they only need to be plausible: the
point is that duplicates cost money, not to match an invoice to the cent).

``cost_usd = (input_tokens * input_per_million + output_tokens * output_per_million) / 1e6``

A model name is matched exactly first, then by the longest table entry it starts
with (so ``gpt-4o-2024-08-06`` is priced as ``gpt-4o`` and ``gpt-4o-mini-x`` as
``gpt-4o-mini``); anything else is priced at :data:`DEFAULT_PRICE`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["DEFAULT_PRICE", "PRICES", "Price", "cost_usd", "price_for"]


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input tokens and per million output tokens."""

    input_per_million: float
    output_per_million: float


PRICES: dict[str, Price] = {
    # OpenAI chat
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.40),
    # OpenAI legacy completions
    "gpt-3.5-turbo-instruct": Price(1.50, 2.00),
    # OpenAI embeddings (no output tokens)
    "text-embedding-3-small": Price(0.02, 0.0),
    "text-embedding-3-large": Price(0.13, 0.0),
    # Anthropic
    "claude-3-5-haiku-latest": Price(0.80, 4.00),
    "claude-sonnet-4-0": Price(3.00, 15.00),
    "claude-sonnet-4-20250514": Price(3.00, 15.00),
    "claude-sonnet-4-5": Price(3.00, 15.00),  # and its snapshots (claude-sonnet-4-5-20250929)
    "claude-opus-4-0": Price(15.00, 75.00),
}

# For a model the table does not know: a mid-range chat model.
DEFAULT_PRICE = Price(1.00, 4.00)

# Longest first, so the first prefix that matches is the most specific one.
_BY_LENGTH = sorted(PRICES, key=len, reverse=True)


# Clients send a handful of distinct model names, so the prefix search runs once per
# name; the bound keeps a client that invents names from growing memory without limit.
@functools.lru_cache(maxsize=1024)
def price_for(model: str) -> Price:
    """The price of ``model``: exact match, else longest prefix, else :data:`DEFAULT_PRICE`."""
    exact = PRICES.get(model)
    if exact is not None:
        return exact
    for name in _BY_LENGTH:
        if model.startswith(name):
            return PRICES[name]
    return DEFAULT_PRICE


def cost_usd(model: str, input_tokens: int, output_tokens: int) -> float:
    """What one generation of ``model`` costs, rounded to 1e-12 USD to hide float noise."""
    price = price_for(model)
    raw = input_tokens * price.input_per_million + output_tokens * price.output_per_million
    return round(raw / 1_000_000, 12)
