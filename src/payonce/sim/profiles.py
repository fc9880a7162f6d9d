"""How a stream looks on the wire: the upstreams payonce meets, and variations of any.

The simulator's events (:mod:`~payonce.sim.streams`) are OpenAI's and Anthropic's
own. Real servers frame the same answers differently, and each difference met a
gateway defect the default shape never showed (issue 29: comments crashed the
openai SDK behind a keyed stream; one large event stalled the loop). A *wire* is a
profile plus variations, chosen with ``payonce sim --wire`` or per request with
``X-Sim-Wire``, written as ``profile[,variation...]``::

    openrouter,crlf,no-final-blank
    sse-starlette,trickle
    openai,event-bytes=30000000

The profiles (sources in docs/sim.md):

``openai``         today's shape: ``data:`` chunks, ``x-request-id``.
``anthropic``      an ``event: ping`` after every 8 deltas besides the one after
                   ``content_block_start``; a stream that dies sends ``event: error``
                   (``overloaded_error``) and ends the body cleanly, on its 200.
``openrouter``     ``: OPENROUTER PROCESSING`` before the first token (and as the
                   keep-alive); a stream that dies sends a chunk with an ``error``
                   object and ``finish_reason: "error"`` and ends cleanly;
                   ``x-generation-id``; the usage it reports (a stream's final
                   usage, a whole answer's) states the call's own cost in USD,
                   ``usage.cost``, what the ledger bills for it.
``sse-starlette``  llama.cpp's Python server and others built on sse-starlette: CRLF
                   line endings, ``: ping - <UTC time>`` comments, no usage chunk,
                   no request-id header (the body's id is the join key).
``tgi``            Hugging Face TGI (axum's keep-alive): ``:`` comment lines, no
                   request-id header.
``vllm``           OpenAI's shape without a request-id header.
``ollama``         OpenAI's shape (its /v1 endpoint) without a request-id header.
``mock-ids``       mock servers that give every chunk its own id.

The variations, for any profile:

``crlf``             CRLF line endings (sse-starlette's own).
``no-final-blank``   the last event without the blank line that ends it (the body
                     ends after its last line).
``trickle``          every write cut into 7-byte pieces 1 ms apart (short streams).
``event-bytes=N``    the first content delta padded to at least N bytes (one large
                     event, as a base64 image is).
``content-length``   the whole stream gathered and sent with a ``Content-Length``
                     (no chunks; pacing lost; a stream that dies sends nothing).
``close-delimited``  no length and no chunks: the body ends when the connection
                     closes (HTTP/1.0 style).

The ledger bills every shape the same way.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from payonce.errors import ConfigError

__all__ = ["PROFILES", "WIRE_HEADER", "Profile", "Wire", "parse_wire", "with_cost"]

WIRE_HEADER = "X-Sim-Wire"
_FRAMINGS = {"content-length": "length", "close-delimited": "close"}
# An event larger than this is a mistake, not a test: 64 MiB.
_MAX_EVENT_BYTES = 64 * 1024 * 1024


def _openrouter_processing(_now: float) -> bytes:
    return b": OPENROUTER PROCESSING\n\n"


def _starlette_ping(now: float) -> bytes:
    # sse-starlette's ping: f": ping - {datetime.now(timezone.utc)}", CRLF-framed by
    # its own separator (the crlf variation the profile implies adds that).
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC)
    return b": ping - %s\n\n" % str(stamp).encode()


def _bare_colon(_now: float) -> bytes:
    return b":\n\n"


@dataclass(frozen=True, slots=True)
class Profile:
    """One upstream's way of framing a stream (the module docstring).

    ``comment`` renders its keep-alive comment at a given wall time (``None``: it
    sends none); ``comment_first`` sends one after the head, before the first token,
    whatever ``--keep-alive`` says. ``ping_every`` adds an Anthropic ``ping`` event
    after every that many deltas (0: none). ``death`` is what a stream that dies
    sends before it ends: ``"close"`` (the connection closes mid-body), ``"anthropic"``
    (an ``event: error``) or ``"openrouter"`` (an error chunk). ``stated_cost``: its
    usage says what the call cost (OpenRouter's ``usage.cost``).
    """

    name: str
    comment: Callable[[float], bytes] | None = None
    comment_first: bool = False
    ping_every: int = 0
    usage: bool = True
    request_id_header: bool = True
    distinct_ids: bool = False
    crlf: bool = False
    death: str = "close"
    headers: tuple[str, ...] = ()  # extra headers set to the request id
    stated_cost: bool = False


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile("openai", comment=_openrouter_processing),
        Profile("anthropic", comment=_openrouter_processing, ping_every=8, death="anthropic"),
        Profile(
            "openrouter",
            comment=_openrouter_processing,
            comment_first=True,
            death="openrouter",
            headers=("x-generation-id",),
            stated_cost=True,
        ),
        Profile(
            "sse-starlette",
            comment=_starlette_ping,
            comment_first=True,
            usage=False,
            request_id_header=False,
            crlf=True,
        ),
        Profile("tgi", comment=_bare_colon, comment_first=True, request_id_header=False),
        Profile("vllm", request_id_header=False),
        Profile("ollama", request_id_header=False),
        Profile("mock-ids", distinct_ids=True),
    )
}


@dataclass(frozen=True, slots=True)
class Wire:
    """A profile and the variations asked for (the module docstring)."""

    profile: Profile = field(default_factory=lambda: PROFILES["openai"])
    crlf: bool = False
    no_final_blank: bool = False
    trickle: bool = False
    event_bytes: int = 0
    framing: str = "chunked"  # or "length", "close" (sim/wire.py, EventSender)

    @property
    def plain(self) -> bool:
        """Today's OpenAI/Anthropic shape, untouched (the fast path)."""
        return self is DEFAULT_WIRE or self == DEFAULT_WIRE

    @property
    def line_endings_crlf(self) -> bool:
        return self.crlf or self.profile.crlf

    def comment(self, now: float) -> bytes | None:
        """The keep-alive comment to send now, framed; ``None`` when the profile has none."""
        render = self.profile.comment
        return None if render is None else self.frame(render(now))

    def frame(self, event: bytes) -> bytes:
        """An event with this wire's line endings."""
        return event.replace(b"\n", b"\r\n") if self.line_endings_crlf else event

    def last(self, event: bytes) -> bytes:
        """The terminating event, its blank line dropped with ``no-final-blank``."""
        framed = self.frame(event)
        if not self.no_final_blank:
            return framed
        return framed[:-2] if framed.endswith(b"\r\n\r\n") else framed[:-1]

    def shape(self, event: bytes, request_id: str, index: int, cost: float | None = None) -> bytes:
        """A data event as this wire sends it (ids, usage, its cost), before framing."""
        if not self.profile.usage and b'"usage":{' in event and b'"choices":[]' in event:
            return b""  # the server sends no usage chunk
        if self.profile.distinct_ids:
            own = b'"id":"%s-%d"' % (request_id.encode(), index)
            event = event.replace(b'"id":%s' % orjson.dumps(request_id), own, 1)
        if cost is not None and self.profile.stated_cost:
            event = with_cost(event, cost)
        return event

    def pad(self, event: bytes) -> bytes:
        """The first content delta, padded to ``event_bytes`` with more of its text."""
        missing = self.event_bytes - len(event)
        if missing <= 0:
            return event
        # The piece is the first JSON string after "content": or "text": in the event.
        for marker in (b'"content":"', b'"text":"'):
            at = event.find(marker)
            if at >= 0:
                at += len(marker)
                return event[:at] + b"x" * missing + event[at:]
        return event

    def error_event(self, request_id: str, model: str) -> bytes | None:
        """What a stream that dies sends before its clean end; ``None``: it just closes."""
        death = self.profile.death
        if death == "anthropic":
            overloaded = {"type": "overloaded_error", "message": "Overloaded"}
            error = {"type": "error", "error": overloaded}
            return self.frame(b"event: error\ndata: %s\n\n" % orjson.dumps(error))
        if death == "openrouter":
            chunk = {
                "id": request_id,
                "object": "chat.completion.chunk",
                "model": model,
                "provider": "simulated",
                "error": {"code": "server_error", "message": "Provider disconnected unexpectedly"},
                "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
            }
            return self.frame(b"data: %s\n\n" % orjson.dumps(chunk))
        return None


DEFAULT_WIRE = Wire()


def with_cost(body: bytes, cost: float) -> bytes:
    """``body``'s usage object with the call's own cost in it (``"usage":{"cost":...``).

    For a stream, the event that carries its final usage: OpenAI's usage chunk, the
    Responses API's ``response.completed``, Anthropic's ``message_delta`` (not
    ``message_start``, whose usage is only the input so far). Other events and
    bodies without a usage object are returned as they are.
    """
    if b'"usage":{' not in body or b'"message_start"' in body:
        return body
    return body.replace(b'"usage":{', b'"usage":{"cost":%s,' % orjson.dumps(cost), 1)


def parse_wire(text: str, *, flag: str) -> Wire:
    """``profile[,variation...]`` (the module docstring); raises :class:`ConfigError`."""
    name, *variations = [part.strip() for part in text.split(",")]
    profile = PROFILES.get(name.lower())
    if profile is None:
        known = ", ".join(PROFILES)
        raise ConfigError(f"{flag}: unknown profile {name!r} (known: {known})")
    crlf = no_final_blank = trickle = False
    event_bytes = 0
    framing = "chunked"
    for variation in variations:
        word, _, value = variation.partition("=")
        word = word.lower()
        if word == "crlf" and not value:
            crlf = True
        elif word == "no-final-blank" and not value:
            no_final_blank = True
        elif word == "trickle" and not value:
            trickle = True
        elif word in _FRAMINGS and not value:
            framing = _FRAMINGS[word]
        elif word == "event-bytes":
            try:
                event_bytes = int(value)
            except ValueError:
                event_bytes = -1
            if not 0 < event_bytes <= _MAX_EVENT_BYTES:
                raise ConfigError(f"{flag}: event-bytes={value!r} is not between 1 and 64 MiB")
        else:
            raise ConfigError(
                f"{flag}: unknown variation {variation!r}"
                " (known: crlf, no-final-blank, trickle, event-bytes=N, content-length,"
                " close-delimited)"
            )
    wire = Wire(profile, crlf, no_final_blank, trickle, event_bytes, framing)
    return DEFAULT_WIRE if wire == DEFAULT_WIRE else wire
