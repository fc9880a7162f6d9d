"""Token usage read from a provider's response body (OpenAI and Anthropic shapes)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import orjson

__all__ = ["extract_usage", "model_and_usage", "model_usage_and_id", "normalise_usage"]


def _decoded(body: bytes, headers: Iterable[tuple[str, str]]) -> bytes | None:
    encoding = next((v.lower() for k, v in headers if k.lower() == "content-encoding"), "")
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "deflate"):
        try:
            # wbits=47 accepts both gzip and zlib wrappers.
            return zlib.decompress(body, 47)
        except zlib.error:
            return None
    return None  # br, zstd: usage is reported as unknown rather than guessed


def extract_usage(body: bytes, headers: Iterable[tuple[str, str]]) -> dict[str, int] | None:
    """``{"input_tokens", "output_tokens", ...}`` from a JSON response, or ``None``."""
    return model_and_usage(body, headers)[1]


def model_and_usage(
    body: bytes, headers: Iterable[tuple[str, str]]
) -> tuple[str | None, dict[str, int] | None]:
    """The ``model`` and normalised usage of a JSON response (see :func:`model_usage_and_id`)."""
    model, usage, _ = model_usage_and_id(body, headers)
    return model, usage


def model_usage_and_id(
    body: bytes, headers: Iterable[tuple[str, str]]
) -> tuple[str | None, dict[str, int] | None, str | None]:
    """The ``model``, normalised usage and ``id`` of a JSON response.

    The ``id`` is the provider's request id when no header carries one.

    OpenAI reports ``prompt_tokens``/``completion_tokens``; Anthropic reports
    ``input_tokens``/``output_tokens``; both are mapped to the latter names.
    ``input_tokens`` always counts every input token: Anthropic reports cache
    reads apart, so they are added in; ``cached_input_tokens`` says how many
    of them were cache hits. Reasoning token counts are kept when present.
    """
    headers = tuple(headers)
    raw = _decoded(body, headers)
    if not raw or raw[:1] != b"{":
        return None, None, None
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None, None
    if not isinstance(document, dict):
        return None, None, None
    model = document.get("model")
    model = model if isinstance(model, str) else None
    identifier = document.get("id")
    identifier = identifier if isinstance(identifier, str) and identifier else None
    return model, normalise_usage(document.get("usage")), identifier


def normalise_usage(usage: object) -> dict[str, int] | None:
    """A provider's ``usage`` object in payonce's names (see :func:`model_and_usage`)."""
    if not isinstance(usage, dict):
        return None
    result: dict[str, int] = {}
    for source, target in (
        ("prompt_tokens", "input_tokens"),
        ("completion_tokens", "output_tokens"),
        ("input_tokens", "input_tokens"),
        ("output_tokens", "output_tokens"),
        ("cache_read_input_tokens", "cached_input_tokens"),
    ):
        value = usage.get(source)
        if isinstance(value, int) and not isinstance(value, bool):
            result[target] = value
    # Chat completions name the details after prompt/completion; the Responses
    # API after input/output.
    for name in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(name)
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            result["cached_input_tokens"] = details["cached_tokens"]
    for name in ("completion_tokens_details", "output_tokens_details"):
        details = usage.get(name)
        if isinstance(details, dict) and isinstance(details.get("reasoning_tokens"), int):
            result["reasoning_tokens"] = details["reasoning_tokens"]
    if "input_tokens" not in result and "output_tokens" not in result:
        return None
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        for extra in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            value = usage.get(extra)
            if isinstance(value, int):
                result["input_tokens"] = result.get("input_tokens", 0) + value
    result.setdefault("output_tokens", 0)  # embeddings report input tokens only
    # The cost the provider states itself (OpenRouter's usage.cost, USD), kept in
    # nano-USD so that usage stays integers (observe/pricing.py prices by it).
    cost = usage.get("cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool) and 0 <= cost < 1e6:
        result["provider_cost_nano_usd"] = round(cost * 1e9)
    return result
