"""Streamed answers: the server-sent events a provider sends for ``"stream": true``.

A stream is the same answer as the JSON body (:mod:`~payonce.sim.bodies`), cut into
one event per output token: each content delta carries the next ``4``-character
piece of :func:`~payonce.sim.bodies.answer_text`, so the pieces of every choice add
up to that choice's text in the JSON answer, and a 200-token answer is 200 deltas.
Usage in the stream equals the JSON answer's usage for the same request.

OpenAI ``/v1/chat/completions`` (``data: <chunk>`` lines; one chunk per choice and
token, choices interleaved token by token)::

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,"model":"gpt-4o",
           "system_fingerprint":"fp_payonce_sim","choices":[{"index":0,"delta":{"role":
           "assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}
    data: {… "choices":[{"index":0,"delta":{"content":"This"},"logprobs":null,
           "finish_reason":null}]}                                    (one per token)
    data: {… "choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}
    data: {… "choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16,
           "total_tokens":21}}                 (only with stream_options.include_usage)
    data: [DONE]

With ``stream_options: {"include_usage": true}`` every other chunk carries
``"usage":null``, as OpenAI's do. ``/v1/completions`` is the same without the role
chunk, with ``"object":"text_completion"`` and choices ``{"text","index","logprobs",
"finish_reason"}`` (the finishing chunk has ``"text":""``).

Anthropic ``/v1/messages`` (``event: <type>`` then ``data: <json>``)::

    message_start        {"type":"message_start","message":{"id":"msg_…","type":"message",
                          "role":"assistant","model":…,"content":[],"stop_reason":null,
                          "stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}
    content_block_start  {"type":"content_block_start","index":0,
                          "content_block":{"type":"text","text":""}}
    ping                 {"type":"ping"}
    content_block_delta  {"type":"content_block_delta","index":0,
                          "delta":{"type":"text_delta","text":"This"}}   (one per token)
    content_block_stop   {"type":"content_block_stop","index":0}
    message_delta        {"type":"message_delta","delta":{"stop_reason":"end_turn",
                          "stop_sequence":null},"usage":{"output_tokens":16}}
    message_stop         {"type":"message_stop"}

Every event ends with a blank line. The bytes are assembled from per-request
prefixes and precomputed token pieces: a 1,000-token stream costs a few
concatenations per event, not a JSON encoding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson

from payonce.sim.bodies import SYSTEM_FINGERPRINT, answer_text
from payonce.sim.prompts import CHARS_PER_TOKEN, MAX_ANSWER_TOKENS, Ask

__all__ = [
    "DONE",
    "KEEP_ALIVE",
    "PING",
    "TOKEN_PIECES",
    "EventStream",
    "chat_completion_stream",
    "message_stream",
    "text_completion_stream",
]

DONE = b"data: [DONE]\n\n"
# A comment, not an event (WHATWG HTML 9.2.6: a line that starts with a colon):
# OpenRouter's, byte for byte, sent while a model has not answered yet;
# sse-starlette sends ": ping" the same way. Clients must ignore it.
KEEP_ALIVE = b": OPENROUTER PROCESSING\n\n"

_TEXT = answer_text(MAX_ANSWER_TOKENS)
# Token i of every answer, JSON-encoded once: the answer text never changes.
_PIECES = tuple(
    orjson.dumps(_TEXT[i * CHARS_PER_TOKEN : (i + 1) * CHARS_PER_TOKEN])
    for i in range(MAX_ANSWER_TOKENS)
)
TOKEN_PIECES = _PIECES  # for the other streams (the Responses API's, in sim/responses.py)


@dataclass(frozen=True, slots=True)
class EventStream:
    """One streamed answer as the events a provider sends, in order.

    ``head`` are the events before the first token, then come ``tokens`` content
    deltas (``token(i)`` renders the i-th, one per output token), then ``tail``,
    whose last event is the terminating one (``[DONE]`` or ``message_stop``).
    """

    head: tuple[bytes, ...]
    tokens: int
    token: Callable[[int], bytes]
    tail: tuple[bytes, ...]

    @property
    def count(self) -> int:
        """How many events the whole stream has, the terminating one included."""
        return len(self.head) + self.tokens + len(self.tail)

    def is_token(self, index: int) -> bool:
        """Whether event ``index`` is a content delta (one generated token)."""
        return 0 <= index - len(self.head) < self.tokens

    def event(self, index: int) -> bytes:
        """Event ``index`` (0 <= index < :attr:`count`), encoded and framed."""
        position = index - len(self.head)
        if position < 0:
            return self.head[index]
        if position < self.tokens:
            return self.token(position)
        return self.tail[position - self.tokens]

    def __iter__(self) -> Iterator[bytes]:
        return (self.event(index) for index in range(self.count))


def chat_completion_stream(ask: Ask, request_id: str, created: int) -> EventStream:
    """OpenAI ``chat.completion.chunk`` events for ``ask``."""
    prefix, suffix = _openai_frame("chat.completion.chunk", ask, request_id, created)
    finish = _finish_reason(ask)
    head = tuple(
        b'%s{"index":%d,"delta":{"role":"assistant","content":"","refusal":null},'
        b'"logprobs":null,"finish_reason":null}%s' % (prefix, index, suffix)
        for index in range(ask.choices)
    )
    openers = tuple(
        b'%s{"index":%d,"delta":{"content":' % (prefix, index) for index in range(ask.choices)
    )
    closer = b'},"logprobs":null,"finish_reason":null}' + suffix
    finishes = tuple(
        b'%s{"index":%d,"delta":{},"logprobs":null,"finish_reason":"%s"}%s'
        % (prefix, index, finish, suffix)
        for index in range(ask.choices)
    )
    return EventStream(
        head=head,
        tokens=ask.output_tokens,
        token=_interleaved(openers, closer, ask.choices),
        tail=(*finishes, *_usage_and_done(prefix, ask)),
    )


def text_completion_stream(ask: Ask, request_id: str, created: int) -> EventStream:
    """OpenAI legacy ``text_completion`` events for ``ask``."""
    prefix, suffix = _openai_frame("text_completion", ask, request_id, created)
    finish = _finish_reason(ask)
    opener = prefix + b'{"text":'
    closers = tuple(
        b',"index":%d,"logprobs":null,"finish_reason":null}%s' % (index, suffix)
        for index in range(ask.choices)
    )
    finishes = tuple(
        b'%s{"text":"","index":%d,"logprobs":null,"finish_reason":"%s"}%s'
        % (prefix, index, finish, suffix)
        for index in range(ask.choices)
    )

    def token(i: int) -> bytes:
        position, choice = divmod(i, ask.choices)
        return b"".join((opener, _PIECES[position], closers[choice]))

    return EventStream(
        head=(),
        tokens=ask.output_tokens,
        token=token,
        tail=(*finishes, *_usage_and_done(prefix, ask)),
    )


def message_stream(ask: Ask, request_id: str, created: int) -> EventStream:
    """Anthropic message events for ``ask`` (``created`` is unused, as in the JSON body)."""
    start = {
        "type": "message_start",
        "message": {
            "id": request_id,
            "type": "message",
            "role": "assistant",
            "model": ask.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": ask.input_tokens, "output_tokens": 1},
        },
    }
    delta = {
        "type": "message_delta",
        "delta": {
            "stop_reason": "max_tokens" if ask.truncated else "end_turn",
            "stop_sequence": None,
        },
        "usage": {"output_tokens": ask.output_tokens},
    }
    return EventStream(
        head=(_anthropic_event("message_start", start), _BLOCK_START, PING),
        tokens=ask.output_tokens,
        token=_ANTHROPIC_DELTAS.__getitem__,
        tail=(_BLOCK_STOP, _anthropic_event("message_delta", delta), _MESSAGE_STOP),
    )


# --- helpers -----------------------------------------------------------------------


def _openai_frame(kind: str, ask: Ask, request_id: str, created: int) -> tuple[bytes, bytes]:
    """What every chunk of one OpenAI stream has before and after its one choice."""
    prefix = b'data: {"id":%s,"object":"%s","created":%d,"model":%s,"system_fingerprint":%s,' % (
        orjson.dumps(request_id),
        kind.encode(),
        created,
        orjson.dumps(ask.model),
        orjson.dumps(SYSTEM_FINGERPRINT),
    )
    choices = prefix + b'"choices":['
    suffix = b'],"usage":null}\n\n' if ask.include_usage else b"]}\n\n"
    return choices, suffix


def _usage_and_done(prefix: bytes, ask: Ask) -> tuple[bytes, ...]:
    if not ask.include_usage:
        return (DONE,)
    usage = orjson.dumps(
        {
            "prompt_tokens": ask.input_tokens,
            "completion_tokens": ask.output_tokens,
            "total_tokens": ask.input_tokens + ask.output_tokens,
        }
    )
    return (b'%s],"usage":%s}\n\n' % (prefix, usage), DONE)


def _finish_reason(ask: Ask) -> bytes:
    return b"length" if ask.truncated else b"stop"


def _interleaved(openers: tuple[bytes, ...], closer: bytes, choices: int) -> Callable[[int], bytes]:
    """Token event ``i``: choice ``i % choices`` gets its ``i // choices``-th piece."""
    if choices == 1:
        [opener] = openers
        return lambda i: b"".join((opener, _PIECES[i], closer))

    def token(i: int) -> bytes:
        position, choice = divmod(i, choices)
        return b"".join((openers[choice], _PIECES[position], closer))

    return token


def _anthropic_event(name: str, data: object) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(data))


_BLOCK_START = _anthropic_event(
    "content_block_start",
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
)
PING = _anthropic_event("ping", {"type": "ping"})
_BLOCK_STOP = _anthropic_event("content_block_stop", {"type": "content_block_stop", "index": 0})
_MESSAGE_STOP = _anthropic_event("message_stop", {"type": "message_stop"})
# Anthropic answers have one choice, so every delta event is the same for every request.
_ANTHROPIC_DELTAS = tuple(
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":%s}}\n\n' % piece
    for piece in _PIECES
)
