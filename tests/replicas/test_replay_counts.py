"""A follower that got no answer is no replay: the status endpoint's count.

Found by ``payonce torture`` (SQLite, seed 304561741): a keyed stream and its
duplicate reached a gateway as it was stopped (SIGTERM). The duplicate joined the
running call and was counted as a replay at once; uvicorn's graceful shutdown then
cut it (503), the drain let the call finish and record its answer with that count,
and the record said it had been replayed once, which no call-log line showed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
import uuid
from pathlib import Path

import httpx2 as httpx

from tests.replicas.conftest import AUTH, Gateways
from tests.replicas.test_stream_resume import BODY
from tests.support.sim import Sim
from tests.support.sse import Read, read_stream
from tests.support.waiting import wait_until


def _stream(url: str, key: str, **headers: str) -> Read:
    sent = {**AUTH, "X-Sim-Token-Ms": "5", "Idempotency-Key": key, **headers}
    try:
        return read_stream(url + "/v1/chat/completions", BODY, sent)
    except httpx.HTTPError:
        return Read(0, httpx.Headers(), b"", True)  # cut before any answer


def test_a_follower_cut_at_shutdown_counts_no_replay(
    start_gateways: Gateways, fresh_sim: Sim, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/shared.db"
    # --lease 10s: the drain lets the call finish for 10 s after uvicorn's graceful
    # 5 s cut its clients; the upstream answers about 8 s after the SIGTERM.
    (gateway,) = start_gateways(1, "--lease", "10s", store=store)
    key = f"cut-follower-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        owner = pool.submit(_stream, gateway.url, key, **{"X-Sim-Delay-Ms": "9500"})
        wait_until(lambda: fresh_sim.requests() == 1, "the upstream call")
        follower = pool.submit(_stream, gateway.url, key)
        time.sleep(1.5)  # the duplicate joins the running call
        os.kill(gateway.popen.pid, signal.SIGTERM)
        cut = follower.result(timeout=60)
        owner.result(timeout=60)
    assert cut.status != 200, "the follower was answered: nothing to test"
    assert gateway.popen.wait(timeout=60) == 0
    (again,) = start_gateways(1, store=store)
    status = httpx.get(f"{again.url}/_payonce/requests/{key}", headers=AUTH, timeout=10).json()
    assert status["state"] == "completed", json.dumps(status)
    assert status["replays"] == 0, "a follower cut before its answer counted as a replay"
    assert fresh_sim.requests() == 1
