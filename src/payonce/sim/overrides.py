"""Per-request control headers, so one test can force one outcome.

====================  ==================================================================
header                effect on this request
====================  ==================================================================
``X-Sim-Delay-Ms``    generation time in milliseconds, instead of a ``--latency`` sample
                      (for a stream: the time to the first event)
``X-Sim-Fail``        answer this status (400-599) before any work; not billed
``X-Sim-Drop``        ``1``/``true``: bill, then close the connection without a response
                      (a stream: before its last event); ``0``/``false``: never drop,
                      whatever ``--drop-after-compute`` says
``X-Sim-Token-Ms``    streams: milliseconds between two tokens (0-60000; 0: no pacing),
                      instead of ``--token-rate``
``X-Sim-Die-After``   streams: the provider dies after sending this many events (an
                      integer >= 0, at most all but the terminating one); the connection
                      closes and nothing is billed. Overrides ``--die-mid-stream``
``X-Sim-No-Request-Id`` ``1``/``true``: send no ``x-request-id`` (nor ``request-id``)
                      header, as llama.cpp's server and many self-hosted ones do; the
                      id is then only in the body (and in a stream's events)
``X-Sim-Keep-Alive-Ms`` streams: send the head at once, then an SSE comment every this
                      many milliseconds of silence (0-60000; 0: none), instead of
                      ``--keep-alive``
``X-Sim-Wire``        streams: how the events look on the wire, ``profile[,variation...]``
                      (:mod:`~payonce.sim.profiles`), instead of ``--wire``
====================  ==================================================================

A bad header value is answered 400 (not billed), so a typo in a test fails loudly.
The three stream headers are checked on every request but only act on streams: a
non-streaming request has no tokens to pace and no events to die after.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from payonce.errors import ConfigError
from payonce.sim.faults import validate_status
from payonce.sim.profiles import WIRE_HEADER, Wire, parse_wire
from payonce.sim.provider_errors import BadRequest

__all__ = [
    "DELAY_HEADER",
    "DIE_AFTER_HEADER",
    "DROP_HEADER",
    "FAIL_HEADER",
    "KEEP_ALIVE_HEADER",
    "NO_OVERRIDES",
    "NO_REQUEST_ID_HEADER",
    "TOKEN_MS_HEADER",
    "Overrides",
]

DELAY_HEADER = "X-Sim-Delay-Ms"
FAIL_HEADER = "X-Sim-Fail"
DROP_HEADER = "X-Sim-Drop"
TOKEN_MS_HEADER = "X-Sim-Token-Ms"  # noqa: S105 (a header name, not a secret)
DIE_AFTER_HEADER = "X-Sim-Die-After"
NO_REQUEST_ID_HEADER = "X-Sim-No-Request-Id"
KEEP_ALIVE_HEADER = "X-Sim-Keep-Alive-Ms"
_HEADERS = (
    DELAY_HEADER,
    FAIL_HEADER,
    DROP_HEADER,
    TOKEN_MS_HEADER,
    DIE_AFTER_HEADER,
    NO_REQUEST_ID_HEADER,
    KEEP_ALIVE_HEADER,
    WIRE_HEADER,
)

# One hour: longer is certainly a mistake, and would pin a handler for ever.
_MAX_DELAY_MS = 3_600_000.0
# One minute per token: the same mistake, multiplied by every token of the answer.
_MAX_TOKEN_MS = 60_000.0
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


@dataclass(frozen=True, slots=True)
class Overrides:
    """What the control headers of one request ask for; ``None`` means "not asked"."""

    delay: float | None = None  # seconds
    fail_status: int | None = None
    drop: bool | None = None
    token_interval: float | None = None  # seconds
    die_after: int | None = None  # events
    no_request_id: bool = False  # send the id in the body only
    keep_alive: float | None = None  # seconds between keep-alive comments (0: none)
    wire: Wire | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Overrides:
        """Read the ``X-Sim-*`` headers (``headers`` must be case-insensitive)."""
        delay_text, fail_text, drop_text, token_text, die_text, hide_text, alive_text, wire_text = (
            map(headers.get, _HEADERS)
        )
        # The common case, on the benchmark path: no control header at all.
        if (
            delay_text is None
            and fail_text is None
            and drop_text is None
            and token_text is None
            and die_text is None
            and hide_text is None
            and alive_text is None
            and wire_text is None
        ):
            return NO_OVERRIDES
        return cls(
            delay=None if delay_text is None else _delay(delay_text),
            fail_status=None if fail_text is None else _status(fail_text),
            drop=None if drop_text is None else _flag(drop_text, DROP_HEADER),
            token_interval=None if token_text is None else _token_interval(token_text),
            die_after=None if die_text is None else _event_count(die_text),
            no_request_id=False if hide_text is None else _flag(hide_text, NO_REQUEST_ID_HEADER),
            keep_alive=None if alive_text is None else _keep_alive(alive_text),
            wire=None if wire_text is None else _wire(wire_text),
        )


NO_OVERRIDES = Overrides()


def _delay(text: str) -> float:
    return _millis(text, DELAY_HEADER, _MAX_DELAY_MS) / 1000


def _token_interval(text: str) -> float:
    return _millis(text, TOKEN_MS_HEADER, _MAX_TOKEN_MS) / 1000


def _keep_alive(text: str) -> float:
    return _millis(text, KEEP_ALIVE_HEADER, _MAX_TOKEN_MS) / 1000


def _wire(text: str) -> Wire:
    try:
        return parse_wire(text, flag=WIRE_HEADER)
    except ConfigError as exc:
        raise BadRequest(str(exc)) from None


def _millis(text: str, header: str, upper: float) -> float:
    try:
        millis = float(text)
    except ValueError:
        millis = math.nan
    if not 0 <= millis <= upper:  # also refuses nan
        raise BadRequest(f"{header}: expected milliseconds 0-{upper:.0f}, got {text!r}")
    return millis


def _event_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise BadRequest(f"{DIE_AFTER_HEADER}: expected a number of events >= 0, got {text!r}")
    return count


def _status(text: str) -> int:
    try:
        return validate_status(int(text))
    except ValueError:
        raise BadRequest(f"{FAIL_HEADER}: expected a status 400-599, got {text!r}") from None


def _flag(text: str, header: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadRequest(f"{header}: expected 1 or 0, got {text!r}")
