"""``benchmarks/streams_workers.py`` in its smallest form, so that the script cannot rot.

Issue 33's 5,000 streams through ``--workers 2`` on Redis, here 40 streams of 16
tokens. Nothing bounds a timing: every stream is answered, through the gateway
and straight to the simulator, and each client received as many events through
the gateway as it did straight from the simulator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench_scripts import run_with_redis

pytestmark = [pytest.mark.bench, pytest.mark.timeout(180)]

STREAMS = 40


def test_streams_workers_quick_run(tmp_path: Path) -> None:
    output = tmp_path / "streams.json"
    stdout = run_with_redis(
        "streams_workers.py",
        [
            *("--streams", str(STREAMS), "--tokens", "16", "--token-rate", "50"),
            *("--json", str(output)),
        ],
        tmp_path,
    )
    rows = json.loads(output.read_text())
    payonce, direct = rows["payonce"], rows["direct"]
    assert payonce["answered"] == direct["answered"] == STREAMS
    assert payonce["events"] == direct["events"] > STREAMS * 16
    # CPU is read from /proc in clock ticks (10 ms): 640 events can cost redis-server
    # less than one tick on a fast machine, so only the fields' presence is checked.
    assert payonce["gateway_cpu_us_per_event"] >= 0 and payonce["redis_cpu_us_per_event"] >= 0
    assert "payonce: 40/40 answered" in stdout
