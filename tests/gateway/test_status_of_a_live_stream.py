"""The status endpoint on the gateway that runs a keyed stream (issue 29, defect 7).

``events`` reported the events held in memory, not yet recorded in the store
(4, 8, 3, 7, 9 ... while the client had 167 ... 901 events): the recorder lets
each batch go from memory once it is stored. ``?wait=S`` waited for the whole
run (the full S, or the stream's end) instead of returning on new events.

A real simulator and gateway: one client reads a long keyed stream (400 events,
20 ms apart) while the test polls the status endpoint with the same credential.
"""

from __future__ import annotations

import concurrent.futures
import threading
import uuid

import httpx2 as httpx

from tests.gateway.conftest import AUTH, GatewayFactory, Sim
from tests.support.waiting import wait_until

# The simulator answers as many tokens as the prompt has (a token per 4
# characters), one event per token: about 400 events.
PROMPT = "tell me a long story " * 80
STREAM = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": PROMPT}],
    "max_tokens": 400,
    "stream": True,
}
PACE = {"X-Sim-Token-Ms": "20"}  # 400 events take 8 s or more


class Reader:
    """A client reading a keyed stream: the highest event number (``id:``) it has."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.last = 0
        self.done = threading.Event()

    def __call__(self) -> int:
        headers = {**AUTH, **PACE, "Idempotency-Key": self.key}
        try:
            with httpx.stream(
                "POST", self.url + "/v1/chat/completions", json=STREAM, headers=headers, timeout=60
            ) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line.startswith("id:"):
                        self.last = int(line[3:].strip().partition("-")[0])  # <n>-<run>
        finally:
            self.done.set()
        return self.last


def _status(url: str, key: str, wait: float | None = None) -> dict[str, object]:
    query = "" if wait is None else f"?wait={wait:g}"
    response = httpx.get(f"{url}/_payonce/requests/{key}{query}", headers=AUTH, timeout=200)
    assert response.status_code == 200, response.text
    document: dict[str, object] = response.json()
    return document


def test_events_count_what_the_stream_produced_and_never_go_back(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel")
    key = f"live-{uuid.uuid4()}"
    reader = Reader(gateway.url, key)
    polls: list[tuple[int, int]] = []  # (events the client had before the poll, reported)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        received = pool.submit(reader)
        wait_until(lambda: reader.last >= 50 or reader.done.is_set(), "the first 50 events")
        while not reader.done.is_set():
            before = reader.last
            document = _status(gateway.url, key)
            if document["state"] != "in_progress":
                break
            assert isinstance(document["events"], int), document
            polls.append((before, document["events"]))
        total = received.result()
    assert total > 300, "the stream was long enough to poll"
    assert len(polls) >= 3, polls
    reported = [events for _, events in polls]
    assert reported == sorted(reported), f"events went back: {reported}"
    for before, events in polls:
        # The gateway numbers an event before it relays it: never fewer than the client has.
        assert before <= events <= total, polls
    final = _status(gateway.url, key)
    assert (final["state"], final["events"]) == ("completed", total)
    assert fresh_sim.billed() == 1


def test_a_long_poll_returns_on_new_events_before_the_stream_ends(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel")
    key = f"poll-{uuid.uuid4()}"
    reader = Reader(gateway.url, key)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        received = pool.submit(reader)
        wait_until(lambda: reader.last >= 20 or reader.done.is_set(), "the first 20 events")
        seen = _status(gateway.url, key)
        assert seen["state"] == "in_progress", "polled while the stream runs"
        # A wait far past the stream's end (8 s): an answer before the end is one
        # on new events, not on the stream's completion nor the wait running out.
        changed = _status(gateway.url, key, wait=120)
        total = received.result()
    assert changed["state"] == "in_progress", f"waited for the stream's end: {changed}"
    assert isinstance(seen["events"], int) and isinstance(changed["events"], int)
    assert seen["events"] < changed["events"] < total
    assert fresh_sim.billed() == 1
