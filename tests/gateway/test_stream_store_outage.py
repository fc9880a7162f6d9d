"""A short store outage during a keyed stream: the retry is still a replay (issue 29, defect 2).

Before the fix, one event write that failed (SQLite's write lock held by another
process past ``?timeout``, a Redis frozen with SIGSTOP) stopped recording for
good: the stream was relayed to its end, its key released, and the retry ran
the generation again, a second bill. The same outage during a whole response
was harmless (its completion is retried until the store takes it).

Now the recorder keeps the events it could not write in memory, within a bound
(4 MiB and one ``--lease`` from the first failure), retries them every 0.25 s
while the relay goes on, and writes them in order once the store answers. Past
the bound it gives up: relayed, not stored, key released, and the call log and
``payonce_unstored_responses_total{reason="store_unavailable"}`` say so.

Real processes: the simulator pacing its tokens, a gateway on a SQLite file
(another connection of this test holds ``BEGIN IMMEDIATE``) or on a Redis server
of the test's own (SIGSTOPped, then SIGCONTed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.gateway.conftest import AUTH, Sim
from tests.support.exposition import metric
from tests.support.processes import Process, start_payonce
from tests.support.redis import RedisServer, running_redis

# The simulator answers as many tokens as the prompt has (chars / 4), up to max_tokens:
# about 100 events, one token each, 50 ms apart (X-Sim-Token-Ms).
STREAM_BODY = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Tell me about retries and invoices. " * 12}],
    "max_tokens": 100,
    "stream": True,
}
OUTAGE_AFTER = 20  # events received before the store goes away


@dataclass
class Outage:
    """Makes the store unavailable for a while: SQLite locked, or Redis frozen."""

    backend: str
    db: Path
    redis: RedisServer | None = None

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        if self.backend == "sqlite":
            # Another process's writer: the gateway's writes meet SQLITE_BUSY.
            holder = sqlite3.connect(self.db, isolation_level=None, timeout=10)
            try:
                holder.execute("BEGIN IMMEDIATE")
                yield
            finally:
                holder.execute("ROLLBACK")
                holder.close()
        else:
            assert self.redis is not None and self.redis.popen is not None
            os.kill(self.redis.popen.pid, signal.SIGSTOP)
            try:
                yield
            finally:
                os.kill(self.redis.popen.pid, signal.SIGCONT)


@dataclass
class Gateway:
    process: Process
    call_log: Path
    outage: Outage

    @property
    def url(self) -> str:
        return self.process.url

    def metric(self, name: str, **labels: str) -> float:
        answer = httpx.get(self.url + "/_payonce/metrics", timeout=10)
        return metric(answer.text, name, **labels)

    def lines(self, key: str) -> list[dict[str, Any]]:
        """The call log lines of ``key``, once there is one (written once a second)."""
        deadline = time.monotonic() + 15
        while True:
            found = [
                line
                for line in map(json.loads, self.call_log.read_text().splitlines())
                if line["key"] == key
            ]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


@pytest.fixture(params=["sqlite", "redis"])
def start(
    request: pytest.FixtureRequest, fresh_sim: Sim, tmp_path: Path
) -> Iterator[Callable[..., Gateway]]:
    started: list[Process] = []
    with contextlib.ExitStack() as stack:
        db = tmp_path / "payonce.db"
        redis: RedisServer | None = None
        if request.param == "sqlite":
            # The gateway gives a write up after 0.5 s of meeting the lock.
            store = f"sqlite:///{db}?timeout=0.5"
        else:
            (tmp_path / "redis").mkdir()
            redis = stack.enter_context(running_redis(tmp_path / "redis"))
            store = redis.url + "?timeout=0.5"
        outage = Outage(request.param, db, redis)

        def start_gateway(*flags: str) -> Gateway:
            call_log = tmp_path / "calls.jsonl"
            args = ["serve", "--upstream", fresh_sim.url, "--store", store]
            args += ["--call-log", str(call_log), *flags]
            process = start_payonce(args, log_dir=tmp_path, ready_path="/_payonce/health")
            started.append(process)
            return Gateway(process, call_log, outage)

        try:
            yield start_gateway
        finally:
            for process in started:
                process.stop()


@dataclass
class Read:
    """One streamed answer as it arrived: its bytes, and when each chunk came."""

    status: int = 0
    replayed: str | None = None
    data: bytes = b""
    arrivals: list[float] = field(default_factory=list)

    @property
    def events(self) -> list[bytes]:
        return [event + b"\n\n" for event in self.data.split(b"\n\n") if event]


def read_stream(url: str, key: str, token_ms: int, seen: Callable[[int], None]) -> Read:
    """Stream one keyed request, calling ``seen`` with the events received so far."""
    headers = {**AUTH, "Idempotency-Key": key, "X-Sim-Token-Ms": str(token_ms)}
    read = Read()
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=STREAM_BODY, headers=headers, timeout=60
    ) as response:
        read.status = response.status_code
        read.replayed = response.headers.get("idempotent-replayed")
        for chunk in response.iter_bytes():
            read.data += chunk
            read.arrivals.append(time.monotonic())
            seen(read.data.count(b"\n\n"))
    return read


def stream_through_outage(gateway: Gateway, key: str, outage_seconds: float) -> Read:
    """A keyed stream (about 5 s) during which the store is down for ``outage_seconds``."""
    started = threading.Event()
    reader: dict[str, Read] = {}

    def run() -> None:
        reader["read"] = read_stream(
            gateway.url, key, 50, lambda n: started.set() if n >= OUTAGE_AFTER else None
        )

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(30), "the stream never got going"
    with gateway.outage.down():
        down_at = time.monotonic()
        time.sleep(outage_seconds)
        up_at = time.monotonic()
    thread.join(60)
    read = reader["read"]
    assert read.status == 200
    # The relay went on during the outage: events kept arriving while the store was down.
    during = [t for t in read.arrivals if down_at + 0.6 < t < up_at]
    assert during, "nothing was relayed while the store was down"
    assert read.events[-1].startswith(b"data: [DONE]"), read.events[-3:]
    return read


def test_a_short_outage_mid_stream_is_written_later_and_the_retry_is_a_replay(
    start: Callable[..., Gateway], fresh_sim: Sim
) -> None:
    gateway = start()
    key = f"outage-{uuid.uuid4()}"
    first = stream_through_outage(gateway, key, 2.0)
    assert first.replayed == "false"
    again = read_stream(gateway.url, key, 50, lambda n: None)
    assert again.status == 200
    assert again.replayed == "true", "the retry ran the generation again"
    assert again.events == first.events
    assert fresh_sim.billed() == 1
    [line] = [line for line in gateway.lines(key) if line["outcome"] == "forwarded"]
    assert line["not_stored"] is None
    assert gateway.metric("payonce_unstored_responses_total", reason="store_unavailable") == 0


def test_an_outage_longer_than_a_lease_gives_the_stream_up_and_says_so(
    start: Callable[..., Gateway], fresh_sim: Sim
) -> None:
    # One lease (1 s) from the first failed write is the bound; the store is down for 3 s.
    gateway = start("--lease", "1s")
    key = f"outage-long-{uuid.uuid4()}"
    first = stream_through_outage(gateway, key, 3.0)
    assert first.replayed == "false"
    [line] = gateway.lines(key)
    assert (line["outcome"], line["stream"], line["not_stored"]) == (
        "forwarded",
        True,
        "store_unavailable",
    )
    assert gateway.metric("payonce_unstored_responses_total", reason="store_unavailable") == 1
    given_up = [
        text
        for text in gateway.process.output().splitlines()
        if "gave up recording the stream" in text
    ]
    assert len(given_up) == 1, "one line per stream, not one per event"
    # The key was released, as for any stream not stored: the retry runs again.
    again = read_stream(gateway.url, key, 0, lambda n: None)
    assert (again.status, again.replayed) == (200, "false")
    assert fresh_sim.billed() == 2
