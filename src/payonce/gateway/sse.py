"""Server-sent events as the gateway handles them: split, framed, inspected for usage.

An event is kept (and recorded) as the upstream sent it, terminator included
(``\\n\\n`` or ``\\r\\n\\r\\n``), comment-only blocks too, so a replay frames
them the same way as the first relay. When relayed, each block is framed by
:func:`relayed` (WHATWG HTML 9.2.6 is the reading every rule below preserves):

* a block with data gets an ``id: <n>-<run>`` line, placed last so it wins over
  any id the upstream set: ``n`` its number in the stream (1, 2, ...; comment
  blocks count), ``run`` the 8 hex digits of :func:`run_tag`, which name this
  run of the key. A client that reconnects sends it back as ``Last-Event-ID`` to
  resume after that event, from that run only (gateway/resume.py);
* a block without data (a keep-alive comment such as OpenRouter's
  ``: OPENROUTER PROCESSING``) dispatches nothing, and is sent as its bare lines,
  without its blank line and without an id. Once a stream has carried an id, the
  official SDKs' decoders dispatch an event at every blank line, data or not, and
  parse its empty data as JSON: a comment with its blank line crashed them
  (issue 29). Its ``event:`` and ``id:`` lines are dropped (they would carry over
  to the next event); comments, ``retry:`` and unknown fields stay;
* empty lines before a block (nothing a client dispatches) are dropped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson

from payonce.observe.usage import normalise_usage

__all__ = [
    "NUMBERED",
    "EventSplitter",
    "LastEventId",
    "StreamEnd",
    "StreamId",
    "StreamUsage",
    "ask_for_usage",
    "failed_in_band",
    "first_stream_id",
    "is_event_stream",
    "not_asked_for_usage",
    "read_last_event_id",
    "relayed",
    "run_tag",
]

# An event ends at an empty line (WHATWG HTML 9.2.5): a line ending right after a
# line's own ending, each of them CRLF, LF or CR, mixed as they come ("\n\r\n" too).
# A CR is the start of a CRLF where an LF follows it, never a line ending of its own.
_TERMINATOR = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r)")
_LINE_ENDINGS = b"\r\n"
_BLANK_STARTS = (b"\r", b"\n")  # a chunk that starts with an empty line
# Byte strings are searched with ``find``, not ``in``, on the paths every event
# takes: Python 3.11's ``part in data`` first tries ``part`` as an integer (for
# ``10 in data``) and builds, then drops, a formatted TypeError each time, about
# 2,000 instructions per test and three tests per event (found with gdb on
# PyErr_Format: _Py_bytes_contains -> PyNumber_AsSsize_t).


# The first "id" of a stream is its response's: OpenAI chat chunks start with it,
# Anthropic's message_start has it first in "message", the Responses API first in
# "response" of response.created (and llama.cpp, vLLM, TGI follow OpenAI).
_FIRST_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')
_ID_SCAN_BYTES = 8192


class StreamId:
    """The provider's id of a stream, read from its first bytes (issue 13).

    The join key with a bill when the upstream sends no ``x-request-id`` header
    (llama.cpp's server, many self-hosted ones). Only the first 8 KiB are looked
    at, chunk by chunk, so a long stream costs nothing more once it is found.
    """

    __slots__ = ("done", "seen", "value")

    def __init__(self) -> None:
        self.value: str | None = None
        self.done = False
        self.seen = 0

    def feed(self, data: bytes) -> bool:
        """Look at the next bytes; True once the id is found or the scan gave up."""
        match = _FIRST_ID.search(data)
        if match is not None:
            self.value = match.group(1).decode("utf-8", "replace")
            self.done = True
            return True
        self.seen += len(data)
        self.done = self.seen >= _ID_SCAN_BYTES
        return self.done

    def feed_events(self, events: Iterable[bytes]) -> None:
        """Look at whole events until the id is found or the scan gave up."""
        for event in events:
            if self.done or self.feed(event):
                return


def first_stream_id(events: Iterable[bytes]) -> str | None:
    """The provider's id in a recorded stream's first events (see :class:`StreamId`)."""
    stream_id = StreamId()
    stream_id.feed_events(events)
    return stream_id.value


class StreamEnd:
    """Whether a stream of a protocol payonce knows has sent its end event.

    OpenAI's chunks end with ``data: [DONE]``, Anthropic's messages with
    ``message_stop``, the Responses API's with ``response.completed``
    (``.incomplete``, ``.failed``), and any of them may end with an error event.
    A body delimited by the end of its connection cannot otherwise tell a crash
    from an end: such a stream that stops before its end event was cut, and
    is never taken as whole. Streams of other shapes are never judged (``cut``
    stays False): nothing says how they end.
    """

    __slots__ = ("ended", "known")

    def __init__(self) -> None:
        self.known = False
        self.ended = False

    def feed(self, event: bytes) -> None:
        if self.ended:
            return
        if not self.known:
            self.known = _KNOWN_STREAM.search(event) is not None
        if _STREAM_END.search(event) is not None or failed_in_band(event):
            self.ended = True

    @property
    def cut(self) -> bool:
        """A known protocol's stream, and its end event never came."""
        return self.known and not self.ended


_KNOWN_STREAM = re.compile(
    rb'"object":\s*"(?:chat\.completion\.chunk|text_completion)"'
    rb'|"type":\s*"(?:message_start|response\.created)"'
)
_STREAM_END = re.compile(
    rb"(?:\A|[\r\n])data: ?\[DONE\]"
    rb'|"type":\s*"(?:message_stop|response\.completed|response\.incomplete|response\.failed)"'
)


def is_event_stream(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == (
        "text/event-stream"
    )


def _terminators(buffer: bytes, start: int) -> Iterator[tuple[int, int]]:
    """Where the events in ``buffer`` end, from ``start``: each terminator's span.

    Without a CR in the buffer (every upstream seen so far), a terminator is
    exactly ``\n\n``, which ``bytes.find`` finds at memchr speed: the regex
    spent ~15,000 instructions on each 240-byte token event, a sixth of a keyed
    event's cost (benchmarks/NOTEBOOK.md, "Streams: the event's path in the
    upstream's callback").
    """
    if buffer.find(b"\r") >= 0:
        for match in _TERMINATOR.finditer(buffer, start):
            yield match.span()
        return
    find = buffer.find
    at = find(b"\n\n", start)
    while at >= 0:
        yield at, at + 2
        at = find(b"\n\n", at + 2)


class EventSplitter:
    """Cuts a byte stream into whole events, however the chunks fall.

    An event is what a client dispatches: its lines up to and including the
    empty line that ends it. Empty lines before its first line (nothing for a
    client to dispatch) stay in front of it, so every event has a line of its
    own and the events, put together, are the stream byte for byte.

    Each byte is searched about once: a chunk that ends no event is kept aside
    and only its last bytes are looked at again with the next chunk (a
    terminator spans at most 4 bytes). Joining every chunk onto the event so far
    and searching all of it again took a minute for an 8 MB event in 4 KiB
    chunks, and 6.8 s for a 30 MB one through the gateway (issue 29). One regex
    pass per chunk: searching each terminator separately rescanned the rest of a
    large chunk for every event (quadratic on a 1,000-event burst).
    """

    __slots__ = ("_parts", "_tail")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the event so far, as it came
        self._tail = b""  # its last (up to) 4 bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        end = len(chunk) - 2
        if (
            not self._parts
            and end > 0
            and chunk[-1] == 10
            # A first LF at the end is memchr's work: one line and its blank one
            # (OpenAI's chunks). Else the first blank line, which is slower to find.
            and (chunk.find(b"\n") == end or chunk.find(b"\n\n") == end)
            and chunk[:1] not in _BLANK_STARTS
            and chunk.find(b"\r") < 0
        ):
            # One whole event, ended by its only blank line: what a read is at
            # token rate, told by a few byte searches instead of the loop below.
            return [chunk]
        searched = 0  # where a terminator may start
        if self._parts:
            # An event's end needs a line ending: most chunks of a large event have
            # none, which bytes.find tells at memchr speed (the regex is ~20x slower).
            ends = chunk.find(b"\n") >= 0 or chunk.find(b"\r") >= 0
            if not (ends and _TERMINATOR.search(self._tail + chunk)) and not (
                self._tail.endswith(b"\r") and _TERMINATOR.search(self._tail)
            ):
                self._keep(chunk)  # the event goes on: nothing before it needs a look
                return []
            buffer = b"".join(self._parts) + chunk
            # What was kept ends no event (bar a CR held back for a CRLF, in its
            # last 4 bytes), so the search starts there, not 30 MB back.
            searched = len(buffer) - len(chunk) - len(self._tail)
            self._parts, self._tail = [], b""
        else:
            buffer = chunk
        events: list[bytes] = []
        start = 0
        last = len(buffer)
        for begin, end in _terminators(buffer, searched):
            if end == last and buffer[-1] == 13:
                # A CR at the very end may be the first half of a CRLF: whether the
                # event ends there or one byte later is for the next chunk to say.
                break
            if buffer[start] in _LINE_ENDINGS and not buffer[start:begin].strip(_LINE_ENDINGS):
                continue  # only empty lines so far: they go with the next event
            events.append(buffer[start:end])
            start = end
        if start < last:
            self._keep(buffer[start:] if start else buffer)
        return events

    def _keep(self, part: bytes) -> None:
        self._parts.append(part)
        self._tail = (self._tail + part)[-4:] if len(part) < 4 else part[-4:]

    def close(self) -> list[bytes]:
        """What is left when the stream ends: an unterminated last event, terminated."""
        rest = b"".join(self._parts)
        self._parts, self._tail = [], b""
        if not rest.strip(_LINE_ENDINGS):
            return []
        match = _TERMINATOR.search(rest, len(rest.rstrip(_LINE_ENDINGS)))
        if match is not None and match.end() == len(rest):
            return [rest]  # whole already (its last CR was held back for a CRLF)
        # Complete the last line's ending, then add the empty line.
        if rest.endswith(b"\n"):
            return [rest + b"\n"]
        if rest.endswith(b"\r"):
            return [rest + b"\r"]
        return [rest + b"\n\n"]


# A field named "data" (WHATWG HTML 9.2.6: the name is what comes before the first
# colon, or the whole line), at the start of a line.
_DATA_FIELD = re.compile(rb"(?:\A|[\r\n])data[:\r\n]")
# Fields of a block without data that would carry over to the next block if its
# blank line were dropped: its event type, and an id that only ours should set.
_CARRIED_OVER = frozenset({b"event", b"id"})


def run_tag(token: str) -> bytes:
    """The 8 hex digits that name one run of a key in its events' ids.

    A hash of the run's fencing token, which is unique per claim of the key, so
    each run has its own tag (two runs of one key share one by a 1 in 2^32
    chance) and every replica derives the same tag for a run. The token itself
    stays unknown to clients (payonce.store.base.new_token).
    """
    return hashlib.blake2b(token.encode(), digest_size=4).hexdigest().encode()


# An event that starts with a data line and ends with LF LF (OpenAI's chunks) as a
# client gets it: ``NUMBERED % (event[:-1], number, run)``, its id line before its
# blank line. The first case of :func:`relayed`, which a live relay spells out.
NUMBERED = b"%sid: %d-%s\n\n"


def relayed(event: bytes, number: int, run: bytes) -> bytes:
    """The block as a client gets it (the module docstring): numbered, or bare lines."""
    if event[:5] == b"data:" and event[-2:] == b"\n\n":
        return NUMBERED % (event[:-1], number, run)  # OpenAI's chunks, LF-ended
    # The common cases need no regex: a first line of data (OpenAI's chunks), or a
    # data line after the first (Anthropic's "event: x" then "data: ..."), with no
    # empty line in front.
    if event[:5] != b"data:" and (event[:1] in (b"\r", b"\n") or event.find(b"\ndata:") < 0):
        event = event.lstrip(_LINE_ENDINGS)
        if _DATA_FIELD.search(event) is None:
            return _bare(event)
    ending = b"\r\n" if event.endswith(b"\r\n") else event[-1:]
    return b"%sid: %d-%s%s%s" % (event[: -len(ending)], number, run, ending, ending)


def _bare(event: bytes) -> bytes:
    """A block without data as the lines a client ignores, ended by LF, no blank line."""
    kept = []
    for line in event.splitlines():
        if line and line.split(b":", 1)[0] not in _CARRIED_OVER:
            kept.append(line + b"\n")
    return b"".join(kept)


# An id this gateway sends, "<n>-<run>", or a plain number (what it sent before runs
# were named). At most 18 digits: an event number, not a way to send a huge int.
_EVENT_ID = re.compile(rb"(\d{1,18})(?:-([0-9a-f]{8}))?")


@dataclass(frozen=True, slots=True)
class LastEventId:
    """A resuming client's ``Last-Event-ID``: the events it has, and from which run."""

    after: int
    run: bytes | None  # None: a plain number, which names no run


def read_last_event_id(raw: bytes) -> LastEventId | None:
    """Parse a ``Last-Event-ID`` value; ``None`` when it is no id this gateway sends."""
    match = _EVENT_ID.fullmatch(raw.strip().lower())
    if match is None:
        return None
    return LastEventId(int(match[1]), match[2])


# An error sent as an event of a 200 stream: Anthropic's "event: error" (its data
# {"type":"error",...}, e.g. overloaded_error), or an OpenAI-shaped chunk with a
# top-level "error" object or finish_reason "error" (OpenRouter's mid-stream error).
_IN_BAND_ERROR = re.compile(
    rb'(?:\A|[\r\n])event: ?error[\r\n]|"finish_reason":\s*"error"|\{"type":\s*"error"'
)


def failed_in_band(event: bytes) -> bool:
    """Whether the upstream reported its generation failed in this event, on its 200.

    Such a stream ends cleanly but holds no whole answer (and the provider bills
    none), so it is relayed as it came and never kept as the key's answer. A chunk
    with a top-level ``error`` object counts too; the cheap byte tests come first,
    because every event of every stream passes here.
    """
    if event.find(b"error") < 0:
        return False
    if _IN_BAND_ERROR.search(event) is not None:
        return True
    if event.find(b'"error"') < 0:
        return False
    document = _data_json(event)
    return isinstance(document, dict) and isinstance(document.get("error"), dict)


def _data_json(event: bytes) -> object:
    """The JSON document in an event's ``data:`` lines, or ``None``."""
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    try:
        return orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError:
        return None


# The largest event parsed only to learn the stream's model.
_MODEL_SCAN_BYTES = 65536


class StreamUsage:
    """Token usage gathered from a stream's events (OpenAI and Anthropic shapes).

    OpenAI sends it in a last chunk (``choices: []``; through the LiteLLM proxy,
    one choice with an empty delta) when ``stream_options.include_usage`` is set;
    its Responses API in the response object of ``response.completed``
    (``response.incomplete``, ``response.failed``). Anthropic sends input tokens
    in ``message_start`` and the output count in ``message_delta``.
    """

    def __init__(self) -> None:
        self.model: str | None = None
        self.usage: dict[str, int] | None = None

    def inspect(self, event: bytes) -> bool:
        """Read usage from one event. True when the event is a usage-only OpenAI chunk."""
        # Most events carry neither (or "usage":null, once usage was asked for):
        # parsing every one of a thousand-event stream would cost more than relaying it.
        # One search: the chunks of a stream whose usage was asked for all carry
        # "usage":null but the last (then a second search for it was most of this).
        at = event.find(b'"usage"')
        has_usage = at >= 0 and event[at + 7 : at + 12] != b":null"
        if not has_usage and (
            self.model is not None or event.find(b'"model"') < 0 or len(event) > _MODEL_SCAN_BYTES
        ):
            # A large event (a 30 MB image) is not parsed for its model alone: the
            # next chunks name it too (OpenAI puts it in every chunk).
            return False
        document = _data_json(event)
        if not isinstance(document, dict):
            return False
        kind = document.get("type")
        if (
            isinstance(kind, str)
            and kind.startswith("response.")
            and isinstance(document.get("response"), dict)
        ):
            # The Responses API streams its object inside its lifecycle events: the model
            # from response.created on, the final usage in response.completed, or in
            # response.incomplete when max_output_tokens cut it (response.failed too).
            document = document["response"]
        if self.model is None:
            message = document.get("message")
            source = message if isinstance(message, dict) else document
            model = source.get("model")
            self.model = model if isinstance(model, str) else None
        usage = document.get("usage")
        if kind == "message_start":
            message = document.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
        if isinstance(usage, dict):
            self._merge(usage)
            return _nothing_but_usage(document.get("choices"))
        return False

    def _merge(self, usage: dict[str, object]) -> None:
        normalised = normalise_usage(usage)
        if normalised is None:
            return
        if self.usage is None:
            self.usage = normalised
        else:
            # Anthropic: message_delta's output count replaces message_start's.
            self.usage.update({k: v for k, v in normalised.items() if v or k not in self.usage})


_EMPTY_CHOICE_FIELDS = frozenset({"index", "delta", "text", "finish_reason", "logprobs"})


def _nothing_but_usage(choices: object) -> bool:
    """Whether a chunk's ``choices`` say nothing, so the chunk is there for its usage.

    OpenAI's usage chunk has ``choices: []``; the LiteLLM proxy relays it as one
    choice with an empty delta (``[{"index": 0, "delta": {}}]``).
    """
    if not isinstance(choices, list):
        return False
    return all(
        isinstance(choice, dict)
        and choice.keys() <= _EMPTY_CHOICE_FIELDS
        and not choice.get("delta")
        and not choice.get("text")
        and choice.get("finish_reason") is None
        and choice.get("logprobs") is None
        for choice in choices
    )


def ask_for_usage(path: str, body: bytes) -> bytes | None:
    """The request body with ``stream_options.include_usage`` set, when it needs it.

    For an OpenAI streamed completion that did not ask for usage, the gateway
    asks on the client's behalf so the cost is always known, and strips the
    extra usage chunk before relaying. ``None`` when nothing changes.
    """
    if not (path.endswith("/chat/completions") or path.endswith("/completions")):
        return None
    if body.find(b'"stream"') < 0 and body.find(b"\\u") < 0:
        # No member spelled "stream", nor one spelled with escapes: not a stream,
        # and the body (a whole prompt, often many kilobytes) need not be parsed.
        return None
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict) or document.get("stream") is not True:
        return None
    options = document.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    if options is not None and not isinstance(options, dict):
        return None  # malformed: let the upstream answer it as it would
    document["stream_options"] = {**(options or {}), "include_usage": True}
    return orjson.dumps(document)


def not_asked_for_usage(path: str, body: bytes, inject_stream_usage: bool) -> bool:
    """Nobody asked this OpenAI-style stream for its usage (``--no-inject-stream-usage``).

    Only then is a stream without usage not the upstream's omission.
    """
    return not inject_stream_usage and ask_for_usage(path, body) is not None
