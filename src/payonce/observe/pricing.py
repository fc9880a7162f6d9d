"""What a call cost: list prices per million tokens, matched by model name.

Each entry notes where and when its price was read. Unknown models have no
price (``None``), never zero: a cost that silently reads as free hides spend.
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from payonce.errors import ConfigError

__all__ = [
    "PRICES",
    "ModelPrice",
    "cost_of",
    "install_prices",
    "load_prices",
    "price_of",
    "priced_name",
]


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens."""

    input: float
    cached_input: float
    output: float
    source: str
    as_of: str


_OPENAI = "https://openai.com/api/pricing"
_ANTHROPIC = "https://www.anthropic.com/pricing#api"
# Amazon Nova on Bedrock, on-demand, us-east-1; read from the AWS page as quoted by
# bigdataboutique.com/blog/aws-bedrock-pricing-guide (Micro) and
# pristren.com/blog/amazon-nova-micro-ultra-fast (Micro, Lite, Pro), which agree.
# The cached-input rate is not confirmed, so it is the input rate (an upper bound).
# Claude on Bedrock is priced by the Anthropic entries (reconcile maps the ids).
_BEDROCK = "https://aws.amazon.com/bedrock/pricing/"

PRICES: dict[str, ModelPrice] = {
    "gpt-4o": ModelPrice(2.50, 1.25, 10.00, _OPENAI, "2025-06"),
    "gpt-4o-mini": ModelPrice(0.15, 0.075, 0.60, _OPENAI, "2025-06"),
    "gpt-4.1": ModelPrice(2.00, 0.50, 8.00, _OPENAI, "2025-06"),
    "gpt-4.1-mini": ModelPrice(0.40, 0.10, 1.60, _OPENAI, "2025-06"),
    "gpt-4.1-nano": ModelPrice(0.10, 0.025, 0.40, _OPENAI, "2025-06"),
    "o3": ModelPrice(2.00, 0.50, 8.00, _OPENAI, "2025-06"),
    "o3-mini": ModelPrice(1.10, 0.55, 4.40, _OPENAI, "2025-06"),
    "o4-mini": ModelPrice(1.10, 0.275, 4.40, _OPENAI, "2025-06"),
    "gpt-3.5-turbo-instruct": ModelPrice(1.50, 1.50, 2.00, _OPENAI, "2025-06"),
    "text-embedding-3-small": ModelPrice(0.02, 0.02, 0.0, _OPENAI, "2025-06"),
    "text-embedding-3-large": ModelPrice(0.13, 0.13, 0.0, _OPENAI, "2025-06"),
    "claude-3-5-haiku": ModelPrice(0.80, 0.08, 4.00, _ANTHROPIC, "2025-06"),
    "claude-sonnet-4": ModelPrice(3.00, 0.30, 15.00, _ANTHROPIC, "2025-06"),
    "claude-opus-4": ModelPrice(15.00, 1.50, 75.00, _ANTHROPIC, "2025-06"),
    "claude-opus-4-1": ModelPrice(15.00, 1.50, 75.00, _ANTHROPIC, "2025-11"),
    # Opus 4.5 is priced at a third of Opus 4 (Anthropic's pricing page, as quoted by
    # deploybase.ai/articles/claude-api-pricing on 2026-03-21).
    "claude-opus-4-5": ModelPrice(5.00, 0.50, 25.00, _ANTHROPIC, "2026-03"),
    "claude-sonnet-4-5": ModelPrice(3.00, 0.30, 15.00, _ANTHROPIC, "2025-11"),
    "claude-haiku-4-5": ModelPrice(1.00, 0.10, 5.00, _ANTHROPIC, "2025-11"),
    "amazon.nova-micro": ModelPrice(0.035, 0.035, 0.14, _BEDROCK, "2026-12"),
    "amazon.nova-lite": ModelPrice(0.06, 0.06, 0.24, _BEDROCK, "2026-12"),
    "amazon.nova-pro": ModelPrice(0.80, 0.80, 3.20, _BEDROCK, "2026-12"),
}
_LONGEST_FIRST = sorted(PRICES, key=len, reverse=True)
# What may follow a priced name in the name of the same model: Anthropic's "-0"
# alias, a date stamp, "-latest", a Bedrock version tag. Anything else ("-5" in
# claude-opus-4-5, "-mini" in o3-mini, "-audio-preview") is another model, at
# another price, so it is left unpriced rather than priced wrong.
_SAME_MODEL = re.compile(
    r"(?:-0)?(?:-[0-9]{8}|-[0-9]{4}-[0-9]{2}-[0-9]{2})?(?:-latest)?(?:-v[0-9]+(?::[0-9]+)?)?"
)


def load_prices(path: str) -> dict[str, ModelPrice]:
    """Read a ``--prices`` file: TOML or JSON, ``[models."<name>"]`` tables of USD per million.

    Each model takes ``input`` and ``output`` (required), ``cached_input``
    (defaults to ``input``), and ``source`` / ``as_of`` (free text, recommended).
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--prices: cannot read {path}: {exc.strerror}") from None
    try:
        document = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--prices: {path} is not valid {'JSON' if path.endswith('.json') else 'TOML'}: {exc}"
        ) from None
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"--prices: {path} has no [models] table")
    prices: dict[str, ModelPrice] = {}
    for name, entry in models.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"--prices: model {name!r} in {path} must be a table")
        unknown = set(entry) - {"input", "cached_input", "output", "source", "as_of"}
        if unknown:
            raise ConfigError(f"--prices: model {name!r} has unknown fields {sorted(unknown)}")
        try:
            numbers = {
                field: float(entry[field])
                for field in ("input", "output", "cached_input")
                if field in entry
            }
        except (TypeError, ValueError):
            raise ConfigError(f"--prices: model {name!r}: prices must be numbers") from None
        if "input" not in numbers or "output" not in numbers:
            raise ConfigError(f"--prices: model {name!r} needs input and output prices")
        if any(value < 0 for value in numbers.values()):
            raise ConfigError(f"--prices: model {name!r}: prices must not be negative")
        prices[str(name)] = ModelPrice(
            numbers["input"],
            numbers.get("cached_input", numbers["input"]),
            numbers["output"],
            str(entry.get("source", path)),
            str(entry.get("as_of", "")),
        )
    return prices


def install_prices(extra: Mapping[str, ModelPrice]) -> None:
    """Add or replace table entries (``--prices``), once, when the gateway starts."""
    global _LONGEST_FIRST
    PRICES.update(extra)
    _LONGEST_FIRST = sorted(PRICES, key=len, reverse=True)
    price_of.cache_clear()
    priced_name.cache_clear()


@functools.lru_cache(maxsize=1024)
def price_of(model: str) -> ModelPrice | None:
    """Exact name first, then the longest entry of which it is a dated snapshot or alias."""
    name = priced_name(model)
    return PRICES[name] if name is not None else None


@functools.lru_cache(maxsize=1024)
def priced_name(model: str) -> str | None:
    """The table entry that prices ``model`` (``gpt-4o-mini`` for ``gpt-4o-mini-2024-07-18``).

    A bounded name for ``model``: the metrics label it (a caller picks the model
    name, and the upstream echoes it back).
    """
    if model in PRICES:
        return model
    return next(
        (
            name
            for name in _LONGEST_FIRST
            if model.startswith(name) and _SAME_MODEL.fullmatch(model, len(name))
        ),
        None,
    )


def cost_of(model: str | None, usage: Mapping[str, int] | None) -> float | None:
    """USD for one call, or ``None`` when the model or its usage is unknown."""
    if model is None or usage is None:
        return None
    price = price_of(model)
    if price is None:
        return None
    cached = usage.get("cached_input_tokens", 0)
    fresh = max(0, usage.get("input_tokens", 0) - cached)
    return (
        fresh * price.input
        + cached * price.cached_input
        + usage.get("output_tokens", 0) * price.output
    ) / 1_000_000
