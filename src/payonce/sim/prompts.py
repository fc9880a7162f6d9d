"""Read a request body: check it as the provider would, and size the answer.

Each endpoint has a parser turning the decoded JSON into an :class:`Ask`, or raising
:class:`~payonce.sim.provider_errors.BadRequest` (answered 400, never billed).

Token counts are estimated, not tokenised, with formulas simple enough to predict
in a test or a spreadsheet:

* **input tokens** = ``ceil(chars / 4)`` of the prompt text (chat and Anthropic: all
  messages' text content plus the system prompt, counted together; Responses: the
  ``input`` string or its items' text plus ``instructions``; completions and
  embeddings: each prompt or input string counted alone, then summed). A
  pre-tokenised input (a list of token ids) counts one token per id. At least 1.
* **answer tokens** (per choice) = the input tokens clamped to [16, 1024], then
  capped by the request's ``max_tokens`` (chat: ``max_completion_tokens`` first;
  Responses: ``max_output_tokens``, at least 16 as OpenAI requires; completions
  default to 16, as OpenAI's legacy endpoint does). When the cap bites, the finish
  reason is ``length`` (Anthropic: ``max_tokens``; Responses: status ``incomplete``),
  else ``stop`` (``end_turn``; ``completed``).
* **output tokens** = answer tokens x choices (``n``; for completions, x the number
  of prompts). Embeddings have no output tokens.

Because usage depends only on the request body, a retried request costs exactly what
the original cost, which keeps duplicate-billing arithmetic exact in tests. A stream
is sized by the same formulas, so it costs what the same request without ``stream``
costs.

``stream`` must be a boolean. OpenAI's ``stream_options`` (``{"include_usage": bool}``)
is only allowed with ``"stream": true``, as OpenAI answers. The Responses API's
``store`` and ``background`` must be booleans too, and its ``metadata`` a map of
strings (at most 16 pairs, as OpenAI documents).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from payonce.sim.provider_errors import BadRequest

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_COMPLETIONS_MAX_TOKENS",
    "MAX_ANSWER_TOKENS",
    "MIN_ANSWER_TOKENS",
    "MIN_RESPONSES_MAX_OUTPUT_TOKENS",
    "Ask",
    "ResponsesAsk",
    "answer_tokens",
    "estimate_tokens",
    "parse_chat",
    "parse_completion",
    "parse_embedding",
    "parse_message",
    "parse_responses",
]

CHARS_PER_TOKEN = 4
MIN_ANSWER_TOKENS = 16
MAX_ANSWER_TOKENS = 1024
DEFAULT_COMPLETIONS_MAX_TOKENS = 16
# OpenAI refuses a smaller max_output_tokens on /v1/responses.
MIN_RESPONSES_MAX_OUTPUT_TOKENS = 16
_MAX_METADATA_PAIRS = 16
_MAX_CHOICES = 128
_MAX_DIMENSIONS = 3072


@dataclass(frozen=True, slots=True)
class Ask:
    """What one request asks the simulated model for, sized in tokens."""

    model: str
    input_tokens: int
    answer_tokens: int = 0  # per choice
    truncated: bool = False  # max_tokens cut the answer short
    choices: int = 1  # answers returned (n x prompts); embeddings: one per input
    dimensions: int = 0  # embeddings: vector length
    base64: bool = False  # embeddings: encoding_format=base64
    stream: bool = False  # "stream": true, answered as server-sent events
    include_usage: bool = False  # OpenAI streams: stream_options.include_usage
    # The end user the caller named: OpenAI's "user", Anthropic's metadata.user_id.
    user: str = ""

    @property
    def output_tokens(self) -> int:
        """The tokens billed as output: the answer in every choice."""
        return self.answer_tokens * self.choices


@dataclass(frozen=True, slots=True)
class ResponsesAsk(Ask):
    """A ``/v1/responses`` request: an :class:`Ask` and what the response object echoes.

    ``store`` (OpenAI's default: true) keeps the response for ``GET /v1/responses/{id}``;
    ``background`` answers at once and generates afterwards (:mod:`~payonce.sim.responses`).
    """

    store: bool = True
    background: bool = False
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None


def estimate_tokens(chars: int) -> int:
    """``ceil(chars / 4)``: the usual rule of thumb for English text."""
    return -(-chars // CHARS_PER_TOKEN)


def answer_tokens(input_tokens: int, max_tokens: int | None) -> tuple[int, bool]:
    """The answer length and whether ``max_tokens`` truncated it (see module docstring)."""
    natural = min(max(input_tokens, MIN_ANSWER_TOKENS), MAX_ANSWER_TOKENS)
    if max_tokens is not None and max_tokens < natural:
        return max_tokens, True
    return natural, False


def parse_chat(body: object) -> Ask:
    """``POST /v1/chat/completions``: ``model`` and a non-empty ``messages`` list."""
    fields = _object(body)
    model = _model(fields)
    messages = _required(fields, "messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid_type("messages", "a non-empty array of objects")
    chars = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid_type(f"messages[{index}]", "an object with a string 'role'")
        chars += _content_chars(message.get("content"), f"messages[{index}].content")
    stream, include_usage = _openai_stream(fields)
    max_tokens = _optional_count(fields, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _optional_count(fields, "max_tokens")
    input_tokens = max(1, estimate_tokens(chars))
    answer, truncated = answer_tokens(input_tokens, max_tokens)
    choices = _optional_count(fields, "n", upper=_MAX_CHOICES) or 1
    return Ask(
        model,
        input_tokens,
        answer,
        truncated,
        choices,
        stream=stream,
        include_usage=include_usage,
    )


def parse_completion(body: object) -> Ask:
    """``POST /v1/completions``: ``model`` and ``prompt`` (text, texts or token arrays)."""
    fields = _object(body)
    model = _model(fields)
    tokens, prompts = _text_or_tokens(_required(fields, "prompt"), "prompt")
    stream, include_usage = _openai_stream(fields)
    max_tokens = _optional_count(fields, "max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_COMPLETIONS_MAX_TOKENS
    input_tokens = max(1, tokens)
    answer, truncated = answer_tokens(input_tokens, max_tokens)
    choices = (_optional_count(fields, "n", upper=_MAX_CHOICES) or 1) * prompts
    return Ask(
        model,
        input_tokens,
        answer,
        truncated,
        choices,
        stream=stream,
        include_usage=include_usage,
    )


def parse_embedding(body: object) -> Ask:
    """``POST /v1/embeddings``: ``model`` and ``input``; one vector per input."""
    fields = _object(body)
    model = _model(fields)
    tokens, inputs = _text_or_tokens(_required(fields, "input"), "input")
    default_dimensions = 3072 if model.startswith("text-embedding-3-large") else 1536
    dimensions = _optional_count(fields, "dimensions", upper=_MAX_DIMENSIONS)
    encoding = fields.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest(
            f"Invalid value for 'encoding_format': {encoding!r}; expected 'float' or 'base64'.",
            param="encoding_format",
            code="invalid_value",
        )
    return Ask(
        model,
        max(1, tokens),
        choices=inputs,
        dimensions=dimensions or default_dimensions,
        base64=encoding == "base64",
    )


def parse_message(body: object) -> Ask:
    """Anthropic ``POST /v1/messages``: ``model``, ``max_tokens`` and ``messages``."""
    fields = _object(body)
    model = _model(fields)
    max_tokens = _optional_count(fields, "max_tokens")
    if max_tokens is None:
        raise BadRequest("max_tokens: Field required", param="max_tokens")
    messages = _required(fields, "messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: at least one message is required", param="messages")
    chars = _content_chars(fields.get("system"), "system")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadRequest(
                f"messages.{index}.role: Input should be 'user' or 'assistant'",
                param=f"messages.{index}",
            )
        chars += _content_chars(message.get("content"), f"messages.{index}.content")
    stream = _stream(fields)
    input_tokens = max(1, estimate_tokens(chars))
    answer, truncated = answer_tokens(input_tokens, max_tokens)
    return Ask(model, input_tokens, answer, truncated, stream=stream)


def parse_responses(body: object) -> ResponsesAsk:
    """OpenAI ``POST /v1/responses``: ``model`` and ``input`` (a string or input items).

    Every item's text counts (message ``content``, a string or parts with ``text``;
    other items' ``output`` strings, such as ``function_call_output``), and so do the
    ``instructions``. Tools and the rest are accepted and ignored.
    """
    fields = _object(body)
    model = _model(fields)
    value = _required(fields, "input")
    if isinstance(value, str):
        chars = len(value)
    elif isinstance(value, list) and value:
        chars = 0
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise _invalid_type(f"input[{index}]", "an object")
            chars += _content_chars(item.get("content"), f"input[{index}].content")
            output = item.get("output")
            if isinstance(output, str):
                chars += len(output)
    else:
        raise _invalid_type("input", "a string or a non-empty array of input items")
    instructions = fields.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid_type("instructions", "a string")
    chars += len(instructions or "")
    max_tokens = _optional_count(fields, "max_output_tokens")
    if max_tokens is not None and max_tokens < MIN_RESPONSES_MAX_OUTPUT_TOKENS:
        raise BadRequest(
            "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= "
            f"{MIN_RESPONSES_MAX_OUTPUT_TOKENS}, but got {max_tokens} instead.",
            param="max_output_tokens",
            code="integer_below_min_value",
        )
    input_tokens = max(1, estimate_tokens(chars))
    answer, truncated = answer_tokens(input_tokens, max_tokens)
    previous = fields.get("previous_response_id")
    return ResponsesAsk(
        model,
        input_tokens,
        answer,
        truncated,
        stream=_stream(fields),
        store=_flag(fields, "store", default=True),
        background=_flag(fields, "background", default=False),
        instructions=instructions,
        max_output_tokens=max_tokens,
        metadata=_metadata(fields),
        previous_response_id=previous if isinstance(previous, str) else None,
        temperature=_number(fields, "temperature"),
        top_p=_number(fields, "top_p"),
    )


# --- helpers -----------------------------------------------------------------------


def _object(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def _required(fields: dict[str, Any], name: str) -> Any:
    if name not in fields or fields[name] is None:
        raise BadRequest(
            f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
        )
    return fields[name]


def _invalid_type(param: str, expected: str) -> BadRequest:
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}.", param=param, code="invalid_type"
    )


def _model(fields: dict[str, Any]) -> str:
    model = _required(fields, "model")
    if not isinstance(model, str) or not model:
        raise _invalid_type("model", "a non-empty string")
    return model


def _optional_count(fields: dict[str, Any], name: str, *, upper: int | None = None) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    # bool is an int in Python, but true is not a token count.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(
            f"Invalid '{name}': expected an integer >= 1, got {value!r}.",
            param=name,
            code="invalid_value",
        )
    if upper is not None and value > upper:
        raise BadRequest(
            f"Invalid '{name}': {value} is above the maximum of {upper}.",
            param=name,
            code="invalid_value",
        )
    return value


def _stream(fields: dict[str, Any]) -> bool:
    stream = fields.get("stream")
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise _invalid_type("stream", "a boolean")
    return stream


def _flag(fields: dict[str, Any], name: str, *, default: bool) -> bool:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid_type(name, "a boolean")
    return value


def _number(fields: dict[str, Any], name: str) -> float | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid_type(name, "a number")
    return float(value)


def _metadata(fields: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    metadata = fields.get("metadata")
    if metadata is None:
        return ()
    if (
        not isinstance(metadata, dict)
        or len(metadata) > _MAX_METADATA_PAIRS
        or not all(isinstance(value, str) for value in metadata.values())
    ):
        raise _invalid_type("metadata", f"an object of at most {_MAX_METADATA_PAIRS} strings")
    return tuple(metadata.items())


def _openai_stream(fields: dict[str, Any]) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage``, checked as OpenAI checks them."""
    stream = _stream(fields)
    options = fields.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise BadRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
    if not isinstance(options, dict):
        raise _invalid_type("stream_options", "an object")
    include_usage = options.get("include_usage")
    if include_usage is None:
        return stream, False
    if not isinstance(include_usage, bool):
        raise _invalid_type("stream_options.include_usage", "a boolean")
    return stream, include_usage


def _content_chars(content: object, param: str) -> int:
    """Characters of text in a message content: a string or a list of content parts."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        chars = 0
        for part in content:
            # Non-text parts (images, tool calls) are free here: the sim bills text only.
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                chars += len(part["text"])
        return chars
    raise _invalid_type(param, "a string or an array of content parts")


def _text_or_tokens(value: object, param: str) -> tuple[int, int]:
    """Tokens and item count of a string, strings, a token array or token arrays."""
    if isinstance(value, str):
        if not value:
            raise BadRequest(f"'{param}' must not be empty.", param=param, code="invalid_value")
        return estimate_tokens(len(value)), 1
    if isinstance(value, list) and value:
        if all(isinstance(item, int) for item in value):
            return len(value), 1
        if all(isinstance(item, str) for item in value):
            return sum(estimate_tokens(len(item)) for item in value), len(value)
        if all(isinstance(item, list) and item for item in value):
            return sum(len(item) for item in value), len(value)
    raise _invalid_type(param, "a string, an array of strings or an array of token arrays")
