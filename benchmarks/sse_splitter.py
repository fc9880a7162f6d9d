"""Instructions the SSE splitter spends per event: the WHATWG splitter against the old regex.

Issue 18 made ``EventSplitter`` cut where a client's parser cuts (any mix of
CRLF, LF and CR line endings; empty lines before an event kept with it). The
baseline is the splitter it replaced (``\\r\\n\\r\\n|\\n\\n|\\r\\r``), copied
here. Each side splits the same 2,000-event OpenAI-style stream, fed one event
per chunk and in 64 KiB bursts, under ``valgrind --tool=callgrind``; the
difference between 2,000 and 1,000 events is divided by 1,000, so start-up
cancels out::

    python benchmarks/sse_splitter.py

Needs valgrind. About half a minute.
"""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import tempfile
from pathlib import Path

EVENT = (
    b'data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1,'
    b'"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"word "},'
    b'"finish_reason":null}]}\n\n'
)
_OLD = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class OldSplitter:
    """The splitter before issue 18."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[bytes] = []
        start = 0
        for match in _OLD.finditer(buffer):
            events.append(buffer[start : match.end()])
            start = match.end()
        self._buffer = buffer[start:]
        return events


def _split(which: str, shape: str, events: int) -> None:
    from payonce.gateway.sse import EventSplitter

    stream = EVENT * events
    if shape == "event":
        chunks = [EVENT] * events
    else:
        chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    splitter = OldSplitter() if which == "old" else EventSplitter()
    count = sum(len(splitter.feed(chunk)) for chunk in chunks)
    assert count == events


def _instructions(which: str, shape: str, events: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--run",
                which,
                shape,
                str(events),
            ],
            check=True,
            capture_output=True,
        )
        for path in glob.glob(str(out)):
            for line in Path(path).read_text().splitlines():
                if line.startswith("summary:") or line.startswith("totals:"):
                    return int(line.split()[1])
    raise RuntimeError("no callgrind summary")


def main() -> None:
    for shape, label in (("event", "one event per chunk"), ("burst", "64 KiB bursts")):
        per_event = {}
        for which in ("old", "new"):
            extra = _instructions(which, shape, 2000) - _instructions(which, shape, 1000)
            per_event[which] = extra / 1000
        ratio = per_event["new"] / per_event["old"]
        print(
            f"{label}: {per_event['new']:.0f} instructions/event, baseline"
            f" {per_event['old']:.0f}: ratio {ratio:.3f}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        _split(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
