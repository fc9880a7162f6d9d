"""The SSE splitter and framing against a reference reading of the WHATWG rules.

WHATWG HTML 9.2.5: a line ends at CRLF, LF or CR; an event ends at an empty line.
The splitter must cut where that reading does, whatever the chunks; an event
with data, framed by the gateway, must read as the same event with its id, and
a block without data as its lines without an empty line (the whole relay, end to
end, is tests/fuzz/test_sse_relay_fuzz.py).
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from payonce.gateway.sse import EventSplitter, relayed
from tests.fuzz.conftest import FUZZ

RUN = b"3fa94c1e"
# Few symbols, so line endings meet each other often.
streams = st.lists(
    st.sampled_from([b"\r", b"\n", b"\r\n", b"data: x", b"id: 9", b":", b"y"]), max_size=24
).map(b"".join)


def reference_events(stream: bytes, *, final: bool = False) -> tuple[list[bytes], bytes]:
    """Events and the unterminated rest, read byte by byte as a client reads them.

    An event ends at an empty line that follows at least one line of its own;
    empty lines before that are kept with it. ``final``: the stream has ended,
    so a CR at its very end is a line ending, not the first half of a CRLF.
    """
    events, start, index = [], 0, 0
    line_has_content = event_has_content = False
    while index < len(stream):
        byte = stream[index]
        if byte in (13, 10):
            if byte == 13 and index + 1 == len(stream) and not final:
                break
            index += 2 if stream[index : index + 2] == b"\r\n" else 1
            if not line_has_content and event_has_content:
                events.append(stream[start:index])
                start, event_has_content = index, False
            line_has_content = False
            continue
        line_has_content = event_has_content = True
        index += 1
    return events, stream[start:]


def fields(event: bytes) -> list[bytes]:
    """The event's lines, as a client reads them (any line ending)."""
    return [line for line in event.splitlines() if line]


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    splitter, out, position = EventSplitter(), [], 0
    for cut in cuts:
        out += splitter.feed(stream[position : position + cut])
        position += cut
    out += splitter.feed(stream[position:])
    return out


@FUZZ
@given(streams)
@example(b"data: a\n\r\ndata: b\n\n")  # LF then an empty CRLF line: two events
@example(b"data: a\r\n\ndata: b\r\r")
@example(b"data: a\n\rdata: b\n\n")
def test_events_end_where_the_whatwg_rules_end_them(stream: bytes) -> None:
    expected, _ = reference_events(stream)
    assert split(stream, []) == expected


@FUZZ
@given(streams, st.data())
def test_every_split_of_a_stream_gives_the_same_events(stream: bytes, data: st.DataObject) -> None:
    whole = split(stream, [])
    for at in range(len(stream) + 1):
        assert split(stream, [at]) == whole, at
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=4), max_size=len(stream)))
    assert split(stream, cuts) == whole


@FUZZ
@given(streams)
def test_the_events_and_the_rest_are_the_stream_byte_for_byte(stream: bytes) -> None:
    splitter = EventSplitter()
    events = splitter.feed(stream)
    rest = stream[sum(map(len, events)) :]
    assert b"".join(events) + rest == stream
    tail = splitter.close()
    if not rest.strip(b"\r\n"):
        assert tail == [], "nothing a client would dispatch"
        return
    [last] = tail
    assert last.startswith(rest) and fields(last) == fields(rest)
    assert reference_events(last, final=True) == ([last], b""), "one whole event"


def has_data(event: bytes) -> bool:
    return any(line.split(b":", 1)[0] == b"data" for line in fields(event))


@FUZZ
@given(streams, st.integers(min_value=1, max_value=10**6))
def test_a_relayed_event_reads_as_the_event_with_its_id_last(stream: bytes, number: int) -> None:
    splitter = EventSplitter()
    for event in [*splitter.feed(stream), *splitter.close()]:
        out = relayed(event, number, RUN)
        if has_data(event):
            assert fields(out) == [*fields(event), b"id: %d-%s" % (number, RUN)]
            again, rest = reference_events(out, final=True)
            assert again == [out] and rest == b"", "still one whole event"
            assert out[:1] not in (b"\r", b"\n"), "no empty line before it"
        else:
            kept = [f for f in fields(event) if f.split(b":", 1)[0] not in (b"event", b"id")]
            assert fields(out) == kept
            assert out == b"".join(line + b"\n" for line in kept), "no empty line at all"
