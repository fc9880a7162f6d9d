"""What a call cost: list prices per million tokens, matched by model name.

Prices come from pydantic's maintained price database, ``genai-prices``
(thousands of models and providers, tiered and cached-token prices, dated),
with a ``--prices`` file on top; a response that states its own cost
(OpenRouter's ``usage.cost``) is priced by it. Each cost says its source
(:data:`SOURCES`). Unknown models have no price (``None``), never zero: a cost
that silently reads as free hides spend.

A model's price is looked up once (cached per name) and turned into floats, so
pricing a call is a few multiplications, not a database search.
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from payonce.errors import ConfigError

__all__ = [
    "PRICES",
    "SOURCES",
    "USUAL_MODELS",
    "ModelPrice",
    "cost_of",
    "install_prices",
    "list_priced",
    "load_prices",
    "price_of",
    "priced",
    "priced_call",
    "priced_name",
]

SOURCES = ("provider", "prices-file", "genai-prices")
# A response's own cost (OpenRouter's usage.cost), in nano-USD, as observe/usage.py keeps it.
PROVIDER_COST = "provider_cost_nano_usd"


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens; ``tiers``: (more than this many input tokens, input,
    cached input, output) rates that replace the base ones, lowest first."""

    input: float
    cached_input: float
    output: float
    source: str
    as_of: str
    name: str = ""  # what prices it: the --prices entry, or genai-prices' model id
    origin: str = "prices-file"  # one of SOURCES
    tiers: tuple[tuple[int, float, float, float], ...] = ()


# The --prices entries (install_prices): matched before the database.
PRICES: dict[str, ModelPrice] = {}
# Models whose metrics series exist from the start (observe/metrics.py): the usual
# ones, labelled by whatever prices them.
USUAL_MODELS = (
    "gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "o3", "o3-mini",
    "o4-mini", "gpt-3.5-turbo-instruct", "text-embedding-3-small", "text-embedding-3-large",
    "claude-3-5-haiku-latest", "claude-sonnet-4-0", "claude-opus-4-0", "claude-opus-4-1",
    "claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5",
)  # fmt: skip
_LONGEST_FIRST: list[str] = []
# What may follow a priced name in the name of the same model: Anthropic's "-0"
# alias, a date stamp, "-latest", a Bedrock version tag. Anything else ("-5" in
# claude-opus-4-5, "-mini" in o3-mini, "-audio-preview") is another model, at
# another price, so it is left unpriced rather than priced wrong.
_SAME_MODEL = re.compile(
    r"(?:-0)?(?:-[0-9]{8}|-[0-9]{4}-[0-9]{2}-[0-9]{2})?(?:-latest)?(?:-v[0-9]+(?::[0-9]+)?)?"
)
# Where a name the database matches to no provider by itself is looked for next:
# OpenAI's embeddings, Bedrock's ids (amazon.nova-micro-v1:0, anthropic.claude-...).
_FALLBACK_PROVIDERS = ("openai", "aws")


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
            str(name),
            "prices-file",
        )
    return prices


def install_prices(extra: Mapping[str, ModelPrice]) -> None:
    """Add or replace ``--prices`` entries, once, when the gateway starts."""
    global _LONGEST_FIRST
    PRICES.update(extra)
    _LONGEST_FIRST = sorted(PRICES, key=len, reverse=True)
    price_of.cache_clear()


def _file_entry(model: str) -> str | None:
    """The ``--prices`` entry of ``model``: its name, else one it is a dated snapshot of."""
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


@functools.lru_cache(maxsize=1024)
def price_of(model: str) -> ModelPrice | None:
    """The ``--prices`` entry for ``model``, else genai-prices' price of it, else ``None``."""
    name = _file_entry(model)
    if name is not None:
        return PRICES[name]
    found = _database_price(model)
    if found is None:
        # A dated snapshot or alias the database does not list yet (gpt-4o-mini-20260105):
        # the model it is a snapshot of.
        stem = _SNAPSHOT_SUFFIX.sub("", model)
        if stem != model and stem:
            found = _database_price(stem)
    return found


_SNAPSHOT_SUFFIX = re.compile(_SAME_MODEL.pattern + "$")


def priced_name(model: str) -> str | None:
    """What prices ``model`` (``gpt-4o-mini`` for ``gpt-4o-mini-2024-07-18``), or ``None``.

    A bounded name for ``model``: the metrics label it (a caller picks the model
    name, and the upstream echoes it back), one of the ``--prices`` entries or
    of the database's model ids.
    """
    price = price_of(model)
    return price.name if price is not None else None


def _database_price(model: str) -> ModelPrice | None:
    """genai-prices' current price of ``model`` as floats, or ``None`` when it has none."""
    try:
        from genai_prices import data_snapshot
    except ImportError:  # pragma: no cover - a dependency; the --prices file still works
        return None
    snapshot = data_snapshot.get_snapshot()
    _bound_caches(snapshot)
    attempts: list[tuple[str, str | None]] = [(model, None)]
    if "/" in model:  # OpenRouter's and LiteLLM's provider/model
        prefix, rest = model.split("/", 1)
        attempts += [(model, "openrouter"), (rest, prefix)]
    attempts += [(model, provider) for provider in _FALLBACK_PROVIDERS]
    for name, provider in attempts:
        try:
            _, info = snapshot.find_provider_model(name, None, provider, None)
        except LookupError:
            continue
        try:
            prices = info.get_prices(datetime.now(UTC))
        except (LookupError, ValueError):  # pragma: no cover - a malformed entry
            return None
        found = _DATABASE.get(info.id)
        if found is None:
            found = _DATABASE[info.id] = _as_floats(info.id, prices)
        return found
    return None


# genai-prices remembers every name it was asked about, found or not; callers choose
# model names, so its memories are emptied past this many (price_of's own cache is
# bounded by its lru_cache).
_DATABASE_MEMORY = 4096


def _bound_caches(snapshot: Any) -> None:
    for name in ("_lookup_cache", "_provider_cache", "_provider_misses"):
        memory = getattr(snapshot, name, None)
        if memory is not None and len(memory) > _DATABASE_MEMORY:
            memory.clear()


# genai-prices' prices already converted, by its model id: every name of one model
# (gpt-4o-mini, gpt-4o-mini-2024-07-18) gets the same price.
_DATABASE: dict[str, ModelPrice | None] = {}


def _as_floats(name: str, prices: Any) -> ModelPrice | None:
    """A database price in floats: base rates and the tiers by input tokens."""
    rates = [getattr(prices, key, None) for key in ("input_mtok", "cache_read_mtok", "output_mtok")]
    if rates[0] is None:
        return None  # no input price: not a token-priced model
    if rates[1] is None:
        rates[1] = rates[0]  # no cache discount known: the input rate, an upper bound
    starts = sorted(
        {tier.start for rate in rates if hasattr(rate, "tiers") for tier in rate.tiers}  # type: ignore[union-attr]
    )

    def at(rate: Any, tokens: int | None) -> float:
        if rate is None:
            return 0.0
        if not hasattr(rate, "tiers"):
            return float(rate)
        chosen: Decimal = rate.base
        if tokens is not None:
            for tier in rate.tiers:
                if tokens > tier.start:
                    chosen = tier.price
        return float(chosen)

    base = [at(rate, None) for rate in rates]
    tiers = tuple((start, *(at(rate, start + 1) for rate in rates)) for start in starts)
    return ModelPrice(
        base[0],
        base[1],
        base[2],
        "https://github.com/pydantic/genai-prices",
        _database_date(),
        name,
        "genai-prices",
        tiers,
    )


@functools.cache
def _database_date() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"genai-prices {version('genai-prices')}"
    except PackageNotFoundError:  # pragma: no cover - not installed as a distribution
        return "genai-prices"


def priced(model: str | None, usage: Mapping[str, int] | None) -> tuple[float | None, str | None]:
    """USD for one call and who priced it (:data:`SOURCES`), or ``(None, None)``.

    A cost the response stated itself wins; else the model's price times its
    tokens; an unknown model or usage is unpriced, never free.
    """
    if usage is None:
        return None, None
    stated = usage.get(PROVIDER_COST)
    if stated is not None:
        return stated / 1e9, "provider"
    return list_priced(model, usage)


def priced_call(
    model: str | None, usage: Mapping[str, int] | None
) -> tuple[float | None, str | None, float | None]:
    """:func:`priced`, and the list price beside a cost the provider stated (else ``None``).

    The list price (``--prices``, genai-prices) of a call the provider priced is
    kept so the two can be compared (the call log's ``list_cost_usd``).
    """
    cost, source = priced(model, usage)
    if source != "provider":
        return cost, source, None
    return cost, source, list_priced(model, usage)[0]


def list_priced(
    model: str | None, usage: Mapping[str, int] | None
) -> tuple[float | None, str | None]:
    """USD for one call at the model's list price (whatever the response stated), and its source."""
    if model is None or usage is None:
        return None, None
    price = price_of(model)
    if price is None:
        return None, None
    input_tokens = usage.get("input_tokens", 0)
    cached = usage.get("cached_input_tokens", 0)
    fresh = max(0, input_tokens - cached)
    rate_in, rate_cached, rate_out = price.input, price.cached_input, price.output
    for start, tier_in, tier_cached, tier_out in price.tiers:
        if input_tokens > start:
            rate_in, rate_cached, rate_out = tier_in, tier_cached, tier_out
    cost = (
        fresh * rate_in + cached * rate_cached + usage.get("output_tokens", 0) * rate_out
    ) / 1_000_000
    return cost, price.origin


def cost_of(model: str | None, usage: Mapping[str, int] | None) -> float | None:
    """USD for one call, or ``None`` when the model or its usage is unknown (:func:`priced`)."""
    return priced(model, usage)[0]
