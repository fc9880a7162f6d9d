"""When a stream's events reach the store, seen from another process.

A gateway writes a stream nobody else follows in batches, at most
``QUIET_SECONDS`` apart, and every ``FLUSH_SECONDS`` once a follower in another
process waits on it (gateway/recording.py). Both bounds must hold whether or
not another event comes: a stream may pause for seconds mid-answer (a model
thinking, a tool call), and the events before the pause must not wait for the
next one. The store here is an SQLite file this test reads itself, as another
process would.
"""

from __future__ import annotations

import concurrent.futures
import sqlite3
import time
from pathlib import Path

import httpx2 as httpx

from tests.gateway.conftest import AUTH, GatewayFactory, Sim
from tests.support.waiting import wait_until

STREAM = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Say hello"}],
    "stream": True,
}


def _recorded(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM payonce_events").fetchone()[0])


def _watched(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(
            db.execute("SELECT count(*) FROM payonce_records WHERE watched = 1").fetchone()[0]
        )


def test_the_events_before_a_pause_reach_the_store_without_waiting_for_the_next(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    database = tmp_path / "shared.db"
    gateway = start_gateway(store=f"sqlite:///{database}")
    # The head (the role chunk) comes at once, the one token 6 s later.
    headers = {**AUTH, "Idempotency-Key": "pause-1", "X-Sim-Token-Ms": "6000"}
    body = {**STREAM, "max_tokens": 1}
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        got_first = time.monotonic()
        # Seen by another process within the quiet interval (1 s) and a group
        # commit, not when the token comes; 3 s only catches a stall.
        wait_until(lambda: _recorded(database) > 0, "the first event in the store", timeout=3)
        assert time.monotonic() - got_first < 4, "the event waited for the next one"
        rest = list(lines)
    assert rest[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in rest


def test_a_follower_in_another_gateway_marks_the_stream_and_gets_it_whole(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    database = tmp_path / "shared.db"
    owner = start_gateway(store=f"sqlite:///{database}")
    follower = start_gateway(store=f"sqlite:///{database}")
    headers = {**AUTH, "Idempotency-Key": "follow-1", "X-Sim-Token-Ms": "100"}
    body = {**STREAM, "max_tokens": 30}

    def read(url: str) -> httpx.Response:
        response = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        response.read()
        return response

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(read, owner.url)
        wait_until(lambda: _recorded(database) > 0, "the owner's first events in the store")
        second = read(follower.url)
        assert _watched(database) == 1, "the follower did not mark the run it waited on"
        original = first.result()
    assert original.status_code == second.status_code == 200
    assert second.headers["idempotent-replayed"] == "true"
    # The same events with the same ids, whatever was written when.
    assert second.content == original.content
    assert fresh_sim.billed() == 1
