"""The gateway's HTTP/1.1 connection: uvicorn's httptools protocol, bounded.

uvicorn with httptools puts no limit on what a client sends before the ASGI app
sees a request, nor on how slowly it sends it. This subclass bounds it, per
connection, and answers by itself (the app never sees such a request):

* the request head (request line and header fields) up to ``--max-header-bytes``
  and ``--max-headers``, else 431 (RFC 6585 section 5). Bytes are counted per
  read, so a head that never ends is refused once the reads past its first one
  exceed the limit: a connection holds at most the limit and two reads (about
  256 KiB each) of it, whatever the client sends after;
* the whole head within ``--header-timeout`` from the connection's start, or from
  the first byte of a later request on a kept-alive connection, else 408 (RFC 9110
  section 15.5.9). A connection on which nothing of a request arrived is closed
  without a response: a 408 there could be taken for the answer to the next
  request the client sends on it (RFC 9112 section 9.5: a server MAY close an
  inactive connection at any time, gracefully);
* a request body must keep coming: at least ``_BODY_MIN_RATE`` bytes a second,
  averaged over each ``--body-timeout`` window (so no pause may last a whole
  window), else 408 while the app has not answered yet. Windows in which the
  gateway itself stopped reading (flow control) do not count;
* the keep-alive idle time is uvicorn's, ``--keep-alive-timeout``;
* the framing RFC 9112 requires of a head: exactly one non-empty ``Host`` (none
  needed in HTTP/1.0), else 400; no ``Expect`` but ``100-continue``, else 417; no
  transfer coding but ``chunked``, else 501 (or 400 when the body's end cannot be
  found) (:func:`_framing_refusal`).

Lingering close. A response sent while the request body is still arriving ends
the connection: it carries ``Connection: close`` (RFC 9112 section 9.6), and the
connection then shuts down its write side and keeps reading and discarding what
the client sends, up to ``linger_bytes`` and ``_LINGER_SECONDS`` or until the
client closes, before closing fully. RFC 9112 section 9.6 describes why: a server
that closes at once while the client's data keeps arriving makes its TCP stack
send a reset, which can erase the response before the client reads it; so a
server "performs a half-close", "continues to read from the connection until it
receives a corresponding close by the client", "finally ... fully closes" (what
nginx and Apache call a lingering close). Without it, a client that only reads
after sending its whole request (urllib) got a reset instead of the 413.

The normal path costs a few attribute updates per read and no per-byte work. A
timer runs from a connection's start to the end of its first request, and on a
later request only while its head or body spans several reads.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import httptools

from payonce.errors import (
    ExpectationFailed,
    HeadersTooLarge,
    MalformedRequest,
    ProblemError,
    RequestTimeout,
    TransferCodingNotImplemented,
)
from payonce.gateway.asgi import WRITE_BODY, problem_document
from payonce.gateway.transport import Transport, socket_body_writer
from payonce.gateway.uvicorn_internals import HttpToolsProtocol

if TYPE_CHECKING:
    from payonce.config import GatewaySettings

__all__ = ["GatewayProtocol", "HttpLimits", "protocol_class"]

log = logging.getLogger("payonce.gateway")

MiB = 1024 * 1024
# Lingering close: at most this long, and at most linger_bytes (HttpLimits).
_LINGER_SECONDS = 10.0
_LINGER_MIN_BYTES = 64 * MiB
# A body slower than this, averaged over a --body-timeout window, is a slow client.
_BODY_MIN_RATE = 1024
_WARN_EVERY = 10.0  # seconds between two log lines about refused connections

_IDLE, _HEAD, _BODY = 0, 1, 2


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The bounds of one connection (docs/gateway.md, "Flags")."""

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 30.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    # What a lingering close reads and discards at most: the rest of a body over
    # --max-body is up to another --max-body or so; never less than 64 MiB.
    linger_bytes: int = _LINGER_MIN_BYTES

    @classmethod
    def of(cls, settings: GatewaySettings) -> HttpLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            keep_alive_timeout=settings.keep_alive_timeout,
            linger_bytes=max(_LINGER_MIN_BYTES, 2 * settings.max_body),
        )


def protocol_class(limits: HttpLimits) -> type[GatewayProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``, bound to ``limits``."""

    class Configured(GatewayProtocol):
        pass

    Configured.limits = limits
    return Configured


# The fields _framing_refusal reads.
_FRAMING_FIELDS = frozenset({b"host", b"expect", b"transfer-encoding"})


def _members(value: bytes) -> list[bytes]:
    """The members of a comma-separated field value, lowercase, without parameters."""
    members = (member.partition(b";")[0].strip().lower() for member in value.split(b","))
    return [member for member in members if member]


def _framing_refusal(headers: list[tuple[bytes, bytes]], version: str) -> ProblemError | None:
    """What is wrong with a request head the parser accepted, if anything.

    * ``Host``: RFC 9112 section 3.2, a server MUST answer 400 to an HTTP/1.1
      request without one, and to any request with more than one or an invalid
      one (empty: an http URI always has a host);
    * ``Expect``: the gateway meets ``100-continue`` (uvicorn sends the 100) and
      nothing else, 417 (RFC 9110 section 10.1.1);
    * ``Transfer-Encoding``: chunked is the one coding the gateway decodes; chunked
      not last, or twice, leaves the body's end unknown (400, RFC 9112 section
      6.3), any other coding is one it does not implement (501, section 6.1).

    One pass and a set look-up per field over the fields uvicorn already holds
    (names are lowercase): about 1 µs for the 16 fields a request from the
    openai SDK carries, in the usual case of one ``Host`` and neither other.
    """
    watched = [field for field in headers if field[0] in _FRAMING_FIELDS]
    if len(watched) == 1 and watched[0][0] == b"host" and watched[0][1].strip():
        return None
    hosts: list[bytes] = []
    expect: list[bytes] = []
    codings: list[bytes] = []
    for name, value in watched:
        if name == b"host":
            hosts.append(value)
        elif name == b"expect":
            expect.extend(_members(value))
        elif name == b"transfer-encoding":
            codings.extend(_members(value))
    if len(hosts) > 1 or (hosts and not hosts[0].strip()) or (not hosts and version != "1.0"):
        return MalformedRequest(
            "the request must carry exactly one Host header field with a value"
            " (RFC 9112 section 3.2); it was not read further"
        )
    if any(member != b"100-continue" for member in expect):
        return ExpectationFailed(
            "this gateway meets no expectation but 100-continue (RFC 9110 section 10.1.1);"
            " send the request without the Expect header field"
        )
    if codings and codings != [b"chunked"]:
        if codings[-1] != b"chunked" or codings.count(b"chunked") > 1:
            return MalformedRequest(
                "Transfer-Encoding must end with chunked, once (RFC 9112 section 6.3);"
                " the request was not read further"
            )
        return TransferCodingNotImplemented(
            f"this gateway decodes no transfer coding but chunked, and the request has"
            f" {b', '.join(codings).decode('latin-1')!r} (RFC 9112 section 6.1); send the"
            " body chunked only, or with Content-Length"
        )
    return None


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a refused request head."""


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of ``limits`` (see the module)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    _warned: ClassVar[float] = -_WARN_EVERY

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn annotates it int; call_later takes any number of seconds.
        self.timeout_keep_alive = cast(int, self.limits.keep_alive_timeout)
        self.lingering = False
        self._raw: asyncio.Transport | None = None
        self._transport: Transport | None = None
        self._phase = _IDLE
        self._in_message = False  # a request has begun and is not complete
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase = _IDLE
        self._read = 0  # length of the read being parsed
        self._head_began = False  # the current head began in the read being parsed
        self._head_bytes = 0  # reads wholly inside the current head
        self._first_read = 0  # length of the read in which it began
        self._body_bytes = 0  # body bytes in the current --body-timeout window
        self._keep_alive = True  # what the client asked for (uvicorn's decision)
        self._refusal: ProblemError | None = None
        self._discarding = False
        self._discard_left = 0
        self._shutting_down = False
        self._linger_timer: asyncio.TimerHandle | None = None

    # -- the connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = cast(asyncio.Transport, transport)
        self._raw = raw
        self._transport = Transport(raw, self, self.loop)
        super().connection_made(cast(asyncio.Transport, self._transport))
        self._phase = _HEAD
        self._arm(_HEAD, self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        self._discarding = True
        super().connection_lost(exc)
        if self._transport is not None:
            self._transport.detach()

    def shutdown(self) -> None:
        self._shutting_down = True
        self._keep_alive = False
        super().shutdown()

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            self._discard(len(data))
            return
        self._read = size = len(data)
        if self._phase == _BODY:
            self._body_bytes += size
        # uvicorn's own data_received, but a refusal from a callback is answered
        # here instead of as uvicorn's "Invalid HTTP request" 400.
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # uvicorn runs with ws="none": nothing is upgraded, as in uvicorn.
            self.logger.warning("Unsupported upgrade request.")
            return
        except httptools.HttpParserError:
            refusal, self._refusal = self._refusal, None
            if refusal is None:
                # Not HTTP/1.1 the parser understands (a CONNECT target, a broken
                # request line, bad chunk sizes): a problem document too, never
                # uvicorn's plain-text 400.
                refusal = MalformedRequest(
                    "the request is not valid HTTP/1.1 (RFC 9112); it was not read further"
                )
                if self._phase == _BODY:  # a broken chunked body: its app is waiting
                    self._refuse_body(refusal)
                    return
            self._refuse(refusal)
            return
        phase = self._phase
        if phase == _HEAD:
            if self._timer is None:  # the head spans reads: from now on it is timed
                self._arm(_HEAD, self.limits.header_timeout)
            if self._head_began:
                # The read it began in may hold the end of the previous request:
                # it is counted when the head completes (on_headers_complete).
                self._head_began = False
            else:
                self._head_bytes += size
                if self._head_bytes > self.limits.max_header_bytes:
                    self._refuse(self._too_large())
        elif phase == _BODY and self._timer_phase != _BODY:  # the body spans reads
            self._body_bytes = 0
            self._arm(_BODY, self.limits.body_timeout)

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        self._phase = _HEAD
        self._head_began = True
        self._head_bytes = 0
        self._first_read = self._read

    def on_headers_complete(self) -> None:
        limits = self.limits
        if self.parser.get_method() == b"CONNECT":
            # A forward proxy's method (RFC 9110 section 9.3.6); the parser would
            # hand the connection over as a tunnel, which nobody here serves.
            self._refusal = MalformedRequest(
                "CONNECT is not served: payonce is a reverse proxy in front of one upstream"
            )
            raise _Refused
        if len(self.headers) > limits.max_headers:
            self._refusal = HeadersTooLarge(
                f"the request has {len(self.headers)} header fields;"
                f" this gateway accepts {limits.max_headers} (--max-headers)"
            )
            raise _Refused
        # Cheap upper bound first: only a head that might be too large is measured.
        if self._head_bytes + self._first_read + self._read > limits.max_header_bytes:
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > limits.max_header_bytes:
                self._refusal = self._too_large()
                raise _Refused
        refusal = _framing_refusal(self.headers, self.parser.get_http_version())
        if refusal is not None:
            self._refusal = refusal
            raise _Refused
        self._phase = _BODY
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:
            if self._transport is not None and self.scope["method"] != "HEAD":
                scope = cast(dict[str, Any], self.scope)
                scope.setdefault("extensions", {})[WRITE_BODY] = socket_body_writer(
                    cycle, self._transport
                )
            # Until the body is complete, a response must end the connection (the
            # rest of the body is not read). on_message_complete restores the client's
            # keep-alive if the body arrives before the response starts.
            self._keep_alive = cycle.keep_alive and not self._shutting_down
            cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_message = False
        self._phase = _IDLE
        self._cancel_timer()
        cycle = self.cycle
        if cycle is not None and self._keep_alive and not cycle.response_started:
            cycle.keep_alive = True

    # -- closing ---------------------------------------------------------------------------

    def _flush(self) -> None:
        """Send the writes held for this turn: before anything else touches the socket."""
        if self._transport is not None:
            self._transport.flush()

    def close_connection(self) -> None:
        """``transport.close()`` from uvicorn: linger if the request is not read to its end."""
        raw = self._raw
        if self.lingering or raw is None:
            return
        self._flush()
        if self._in_message and not self._shutting_down:
            self._linger()
        else:
            raw.close()

    def _linger(self) -> None:
        raw = self._raw
        assert raw is not None
        self.lingering = True
        self._start_discarding()
        self._unset_keepalive_if_required()
        if raw.is_closing():
            return
        self.flow.resume_reading()  # uvicorn's flow control may have paused it
        self._flush()
        if raw.can_write_eof():
            raw.write_eof()  # the response is all there is: the client sees its end now
        self._linger_timer = self.loop.call_later(_LINGER_SECONDS, raw.close)

    def _start_discarding(self) -> None:
        if not self._discarding:
            self._discarding = True
            self._discard_left = self.limits.linger_bytes
        self._phase = _IDLE
        self._cancel_timer()

    def _discard(self, size: int) -> None:
        self._discard_left -= size
        if self._discard_left < 0 and self._raw is not None:
            # Past the bound: a reset is now the client's doing.
            self._flush()
            self._raw.close()

    # -- refusals --------------------------------------------------------------------------

    def _too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(
            "the request line and header fields exceed the"
            f" {self.limits.max_header_bytes} bytes this gateway accepts (--max-header-bytes)"
        )

    def _refuse(self, error: ProblemError) -> None:
        """Answer a request head the app will never see, and end the connection."""
        self._start_discarding()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A pipelined head while the previous response is still being written:
            # no answer can go in between; the connection ends after that response.
            cycle.keep_alive = self._keep_alive = False
            return
        self._answer(error)
        self._linger()

    def _answer(self, error: ProblemError) -> None:
        raw = self._raw
        assert raw is not None
        headers, body = problem_document(error)
        phrase = http.HTTPStatus(error.status).phrase.encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (error.status, phrase)]
        head.extend(name + b": " + value + b"\r\n" for name, value in headers)
        head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self._flush()  # a response before this one goes first
        raw.write(b"".join(head) + body)
        now = time.monotonic()
        if now - GatewayProtocol._warned >= _WARN_EVERY:  # an attack must not flood the log
            GatewayProtocol._warned = now
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            log.warning("refused a request from %s: %d %s", client, error.status, error.detail)

    # -- timers ----------------------------------------------------------------------------

    def _arm(self, phase: int, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_phase = phase
        self._timer = self.loop.call_later(delay, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_phase = _IDLE

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_phase = _IDLE
        if self._discarding or self._raw is None or self._raw.is_closing():
            return
        limits = self.limits
        phase = self._phase
        if phase == _HEAD:
            if not self._in_message:
                self.lingering = True  # nothing to answer, nothing unread
                self._flush()
                self._raw.close()
            else:
                self._refuse(
                    RequestTimeout(
                        "the request line and headers did not arrive within"
                        f" {limits.header_timeout:g}s (--header-timeout)"
                    )
                )
            return
        if phase != _BODY:
            return
        if self.flow.read_paused or self._body_bytes >= _BODY_MIN_RATE * limits.body_timeout:
            # Paused: the gateway stopped reading, not the client. Or enough arrived.
            self._body_bytes = 0
            self._arm(_BODY, limits.body_timeout)
            return
        self._refuse_body(
            RequestTimeout(
                f"the request body arrived slower than {_BODY_MIN_RATE} bytes a second over"
                f" {limits.body_timeout:g}s (--body-timeout)"
            )
        )

    def _refuse_body(self, error: ProblemError) -> None:
        """Refuse a request whose app is waiting for its body (too slow, or malformed)."""
        cycle = self.cycle
        if cycle is None or cycle.response_started:
            # The answer is on its way; the connection ends after it (keep_alive
            # off), or now if the body can no longer be parsed.
            if isinstance(error, MalformedRequest) and self._raw is not None:
                self._flush()
                self._raw.close()
            return
        # The app sees a disconnect, and its sends are dropped; the client gets
        # the problem instead.
        cycle.disconnected = True
        cycle.message_event.set()
        self._start_discarding()
        self._answer(error)
        self._linger()
