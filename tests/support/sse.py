"""Server-sent events as a client reads them: a decoder that follows the standard, and a reader.

:func:`decode` is WHATWG HTML 9.2.6 ("Interpreting an event stream") step by
step, so a test can say what any conforming client (a browser's EventSource,
sse-starlette's or httpx-sse's decoders) dispatches for a byte stream. The
official SDKs' decoders differ in one way that matters here: once a stream has
carried an ``id:``, they dispatch an event at every blank line, even with no
data (and then fail to parse it as JSON); the standard dispatches nothing
without data. Tests compare both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import httpx2 as httpx

__all__ = ["Event", "Read", "completion_ids", "decode", "read_stream"]

_LINE = re.compile(r"\r\n|\n|\r")


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event: its type, its data, and the last event id at that point."""

    type: str
    data: str
    id: str = field(compare=False)


def decode(stream: bytes) -> list[Event]:
    """The events a conforming client dispatches for ``stream``, read to its end.

    What follows the last blank line is an event the stream did not finish: the
    standard discards it ("If the file ends in the middle of an event, before
    the final empty line, the incomplete event is not dispatched").
    """
    text = stream.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    *lines, _unfinished = _LINE.split(text)
    events: list[Event] = []
    data, kind, id_buffer = "", "", ""
    for line in lines:
        if not line:
            # Dispatch: the last event id is set even when nothing is dispatched.
            last_id = id_buffer
            if data:
                events.append(Event(kind or "message", data.removesuffix("\n"), last_id))
            data, kind = "", ""
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            kind = value
        elif name == "data":
            data += value + "\n"
        elif name == "id" and "\0" not in value:
            id_buffer = value
        # retry and unknown fields change no event: ignored here
    return events


def completion_ids(events: list[Event]) -> set[str]:
    """The ``id`` of every JSON event (an OpenAI completion's, on every chunk)."""
    return {json.loads(event.data)["id"] for event in events if event.data != "[DONE]"}


@dataclass
class Read:
    """What one streamed request got: status, headers, the raw body and whether it broke."""

    status: int
    headers: httpx.Headers
    body: bytes
    broken: bool

    @property
    def events(self) -> list[Event]:
        return decode(self.body)

    @property
    def last_event_id(self) -> str:
        events = self.events
        return events[-1].id if events else ""


def read_stream(
    url: str,
    body: object,
    headers: dict[str, str],
    *,
    stop_after: int | None = None,
    timeout: float = 30,
) -> Read:
    """POST ``body`` and read the answer to its end, to a broken connection, or until
    ``stop_after`` events have arrived (then the client hangs up, as one that fails)."""
    received = b""
    status, answered = 0, httpx.Headers()
    with httpx.Client(timeout=timeout) as client:
        try:
            with client.stream("POST", url, json=body, headers=headers) as response:
                status, answered = response.status_code, response.headers
                for chunk in response.iter_raw():
                    received += chunk
                    if stop_after is not None and len(decode(received)) >= stop_after:
                        return Read(status, answered, received, False)
        except httpx.HTTPError:
            if not status:
                raise
            return Read(status, answered, received, True)
    return Read(status, answered, received, False)
