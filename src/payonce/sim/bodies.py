"""Success response bodies, shaped like the providers' own.

Each renderer takes the sized :class:`~payonce.sim.prompts.Ask`, the provider
request id and the ``created`` time, and returns the encoded JSON. They sit on the
request path, so what does not depend on the request (the answer text, embedding
vectors, the model list) is built once and reused.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import random
import struct

from payonce.sim.pricing import PRICES
from payonce.sim.prompts import CHARS_PER_TOKEN, MAX_ANSWER_TOKENS, Ask

__all__ = [
    "SYSTEM_FINGERPRINT",
    "answer_text",
    "anthropic_message",
    "chat_completion",
    "embedding_list",
    "model_list",
    "text_completion",
]

SYSTEM_FINGERPRINT = "fp_payonce_sim"
_MODELS_CREATED = 1_700_000_000  # a fixed date: the listed models do not change

_SENTENCE = "This is a simulated answer from payonce sim; it costs what a real one would. "
# Long enough for the longest answer, so every answer is a slice, not a new string.
_FILLER = _SENTENCE * (MAX_ANSWER_TOKENS * CHARS_PER_TOKEN // len(_SENTENCE) + 1)


def _encode(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def answer_text(tokens: int) -> str:
    """The generated text for an answer of ``tokens`` tokens: ``4 * tokens`` characters."""
    return _FILLER[: tokens * CHARS_PER_TOKEN]


def chat_completion(ask: Ask, request_id: str, created: int) -> bytes:
    """An OpenAI ``chat.completion`` object."""
    text = answer_text(ask.answer_tokens)
    finish_reason = "length" if ask.truncated else "stop"
    return _encode(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": ask.model,
            "choices": [
                {
                    "index": index,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
                for index in range(ask.choices)
            ],
            "usage": _openai_usage(ask),
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
    )


def text_completion(ask: Ask, request_id: str, created: int) -> bytes:
    """An OpenAI legacy ``text_completion`` object."""
    text = answer_text(ask.answer_tokens)
    finish_reason = "length" if ask.truncated else "stop"
    return _encode(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": ask.model,
            "choices": [
                {"text": text, "index": index, "logprobs": None, "finish_reason": finish_reason}
                for index in range(ask.choices)
            ],
            "usage": _openai_usage(ask),
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
    )


def embedding_list(ask: Ask, request_id: str, created: int) -> bytes:
    """An OpenAI embeddings ``list``: one vector per input (``ask.choices``).

    Every vector is the same fixed unit vector of the requested length. The body has
    no id (OpenAI's has none); the provider request id travels in ``x-request-id``.
    """
    vector = _vector_json(ask.dimensions, ask.base64)
    # Spliced by hand: a 1536-float vector is most of the body, and re-encoding it
    # per request would be the most expensive thing the sim does.
    data = ",".join(
        f'{{"object":"embedding","index":{index},"embedding":{vector}}}'
        for index in range(ask.choices)
    )
    usage = f'{{"prompt_tokens":{ask.input_tokens},"total_tokens":{ask.input_tokens}}}'
    model = json.dumps(ask.model)
    return f'{{"object":"list","data":[{data}],"model":{model},"usage":{usage}}}'.encode()


def anthropic_message(ask: Ask, request_id: str, created: int) -> bytes:
    """An Anthropic ``message`` object (``created`` is unused: Anthropic sends none)."""
    return _encode(
        {
            "id": request_id,
            "type": "message",
            "role": "assistant",
            "model": ask.model,
            "content": [{"type": "text", "text": answer_text(ask.answer_tokens)}],
            "stop_reason": "max_tokens" if ask.truncated else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": ask.input_tokens, "output_tokens": ask.output_tokens},
        }
    )


@functools.cache
def model_list(anthropic: bool) -> bytes:
    """``GET /v1/models``: the priced models, in OpenAI's or Anthropic's list shape."""
    names = sorted(PRICES)
    if anthropic:
        created_at = "2023-11-14T22:13:20Z"
        return _encode(
            {
                "data": [
                    {"type": "model", "id": name, "display_name": name, "created_at": created_at}
                    for name in names
                ],
                "has_more": False,
                "first_id": names[0],
                "last_id": names[-1],
            }
        )
    return _encode(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": _MODELS_CREATED, "owned_by": "payonce"}
                for name in names
            ],
        }
    )


def _openai_usage(ask: Ask) -> dict[str, int]:
    return {
        "prompt_tokens": ask.input_tokens,
        "completion_tokens": ask.output_tokens,
        "total_tokens": ask.input_tokens + ask.output_tokens,
    }


# Few distinct lengths are ever asked for; the bound only guards against abuse.
@functools.lru_cache(maxsize=64)
def _vector_json(dimensions: int, as_base64: bool) -> str:
    """A fixed unit vector of ``dimensions`` floats, as JSON (a float array or base64)."""
    rng = random.Random(dimensions)
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(value * value for value in raw))
    values = [value / norm for value in raw]
    if as_base64:
        # OpenAI's base64 format: little-endian float32, base64-encoded.
        packed = struct.pack(f"<{dimensions}f", *values)
        return json.dumps(base64.b64encode(packed).decode("ascii"))
    return json.dumps([round(value, 8) for value in values], separators=(",", ":"))
