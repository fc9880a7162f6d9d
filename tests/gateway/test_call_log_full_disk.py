"""A call log that cannot be written (a full disk) stops neither the gateway's other loops nor the log.

The loop that flushes the call log also writes replay counts to the store; the
first OSError ended it for good: no line was written again, every request's line
stayed in memory, and replay counts never reached the store. ``/dev/full``
answers every write with ENOSPC, as a full disk does.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.support.processes import Process, free_port, running
from tests.support.waiting import wait_until

AUTH = {"Authorization": "Bearer sk-full-disk", "Content-Type": "application/json"}
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def _call(gateway: Process, key: str) -> str:
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions",
        data=json.dumps(BODY).encode(),
        # No latency draw (the built-in simulator's p99 is 10 s).
        headers={**AUTH, "Idempotency-Key": key, "X-Sim-Delay-Ms": "0"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return response.headers.get("idempotent-replayed", "false")


def _replays(gateway: Process, key: str) -> int:
    request = urllib.request.Request(gateway.url + f"/_payonce/requests/{key}", headers=AUTH)
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.load(response)["replays"])


def test_replay_counts_reach_the_store_while_the_call_log_cannot_be_written(
    tmp_path: Path,
) -> None:
    args = [
        "serve", "--upstream", "sim", "--sim-port", str(free_port()), "--store",
        f"sqlite:///{tmp_path}/payonce.db", "--call-log", "/dev/full", "--no-otel",
    ]  # fmt: skip
    with running(args, log_dir=tmp_path, ready_path="/_payonce/health") as gateway:
        assert _call(gateway, "disk-1") == "false"
        wait_until(lambda: "cannot write to /dev/full" in gateway.output(), "the log's error")
        # After the failed write: the loop that writes replay counts goes on.
        assert [_call(gateway, "disk-1") for _ in range(2)] == ["true", "true"]
        wait_until(lambda: _replays(gateway, "disk-1") == 2, "2 replays in the store")
        assert gateway.output().count("cannot write to /dev/full") == 1  # said once
        assert _call(gateway, "disk-2") == "false"  # and the gateway serves on
        assert "Traceback" not in gateway.output()
