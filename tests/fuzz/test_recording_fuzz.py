"""The stream recorder: what it stores and relays does not depend on how the upstream's
bytes were cut into chunks, and its usage is the same for every cut.

In process, with the real in-memory store; the upstream response is the one part
played by the test (``ScriptedResponse``: its status, headers and chunks), since
TCP and aiohttp decide chunk boundaries on a socket and a test cannot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from payonce.clock import SystemClock
from payonce.gateway.lease import Lease
from payonce.gateway.live import LiveStream
from payonce.gateway.recording import record_stream
from payonce.gateway.sse import EventSplitter
from payonce.observe.facts import UpstreamFacts
from payonce.store.memory import MemoryStore

USAGE = b'data: {"id":"c1","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}'
events = st.lists(
    st.sampled_from(
        [
            b'data: {"id":"c1","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"x"}}]}',
            b": ping",
            b"event: message\ndata: {}",
            USAGE,
            b"data: [DONE]",
        ]
    ),
    min_size=1,
    max_size=8,
)
endings = st.sampled_from([b"\n", b"\r\n", b"\r"])


class ScriptedResponse:
    """An upstream response whose body arrives in the given chunks."""

    status = 200
    headers = (("content-type", "text/event-stream"),)
    content_type = "text/event-stream"

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def chunks(self, take: Callable[[bytes], bool] | None = None) -> AsyncIterator[bytes]:
        # Every other chunk offered to ``take`` as the upstream connection offers
        # them, so both ways a chunk reaches the recorder are fuzzed.
        for number, chunk in enumerate(self._chunks):
            await asyncio.sleep(0)
            if take is None or number % 2 or not take(chunk):
                yield chunk


async def _record(chunks: list[bytes]) -> tuple[list[bytes], list[bytes], object]:
    store = MemoryStore()
    claim = await store.claim("tenant", "key", "print", lease=30, ttl=60)
    live = LiveStream(200, ScriptedResponse.headers)
    facts = UpstreamFacts()
    lease = Lease.of(store, claim.record, clock=SystemClock(), duration=30, ttl=60)
    stored = await record_stream(
        lease,
        ScriptedResponse(chunks),  # type: ignore[arg-type]
        live,
        strip_usage=False,
        on_last_event=lambda: None,
        joined=lambda: 0,
        facts=facts,
    )
    assert stored is not None, "a clean end completes the record"
    recorded = await store.read_events("tenant", "key")
    return recorded, list(live.events), facts.usage


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    chunks, position = [], 0
    for cut in cuts:
        chunks.append(stream[position : position + cut])
        position += cut
    return [*chunks, stream[position:]]


@settings(max_examples=60, deadline=None)
@given(events, endings, st.booleans(), st.data())
def test_what_is_recorded_does_not_depend_on_the_chunks(
    lines: list[bytes], ending: bytes, terminated: bool, data: st.DataObject
) -> None:
    stream = b"".join(line.replace(b"\n", ending) + ending * 2 for line in lines)
    if not terminated:
        stream = stream.rstrip(b"\r\n")
    splitter = EventSplitter()
    expected = splitter.feed(stream) + splitter.close()
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=7), max_size=len(stream)))
    whole = asyncio.run(_record([stream]))
    assert whole[0] == expected
    assert asyncio.run(_record(_cut(stream, cuts))) == whole
    byte_by_byte = asyncio.run(_record([stream[i : i + 1] for i in range(len(stream))]))
    assert byte_by_byte == whole
    if USAGE in lines and (terminated or lines[-1] != USAGE or ending != b"\r"):
        assert whole[2] == {"input_tokens": 7, "output_tokens": 3}
