"""``benchmarks/peers.py`` in its smallest form, so that the script cannot rot.

Only the cheap parts: the simulator and payonce on SQLite, a few hundred requests
(workload 1 with wrk, the incident, a few hundred long calls). Nothing here bounds a
timing: the checks are the counts the benchmark publishes (every call answered,
one billed generation per business request through payonce) and that its table,
JSON and chart are written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.apt import installed

pytestmark = [pytest.mark.bench, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 60
CALLS = 100


def test_peers_quick_run_on_payonce_and_the_simulator(tmp_path: Path) -> None:
    installed(["wrk"], "wrk", required=True)
    output, chart = tmp_path / "peers.json", tmp_path / "peers.svg"
    done = subprocess.run(
        [
            *(sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--quick", "--no-install"),
            *("--only", "workload1,workload2,workload4,workload5"),
            *("--systems", "payonce-sqlite,python-relay,python-http-relay"),
            *("--duration", "1", "--warmup", "0", "--replay-keys", "5"),
            *("--incident-requests", str(REQUESTS), "--time-scale", "0.05"),
            *("--calls", str(CALLS)),
            *("--call-seconds", "2", "--json", str(output), "--svg", str(chart)),
        ],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(output.read_text())
    results = report["results"]

    throughput = results["workload1"]
    assert set(throughput) == {
        "payonce-sqlite nokey",
        "payonce-sqlite first",
        "payonce-sqlite replay",
    }
    for row in throughput.values():
        assert row["cpu_us"]["median"] > 0
        assert all(run["errors"] == 0 for run in row["rounds"])

    incident = results["workload2"]["payonce-sqlite"]["rounds"]
    assert [run["billed"] for run in incident] == [REQUESTS]

    for system in ("direct", "payonce-sqlite"):  # direct: the method's own noise
        long_calls = results["workload4"][system]
        assert long_calls["answered"]["median"] == CALLS
        (run,) = long_calls["rounds"]
        # The same-run control calls went direct, unkeyed, and were all answered.
        assert run["control_calls"] == run["control_answered"] == CALLS // 10
        assert run["stream_added_ttfb_p99_ms"] is not None
    assert results["workload4"]["payonce-sqlite"]["rss_per_call_kib"]["median"] > 0

    # Streams at token rate (issue 33's workload): every stream answered whole, every
    # event delivered, keyed and not, and through the bare Python relays (the floors,
    # benchmarks/relay_floor.py, bytes untouched and HTTP parsed; in workload 5
    # only); the CPU and gap figures are for the full run.
    token_rate = results["workload5"]
    assert set(token_rate) == {
        f"{name} {load}"
        for name in (
            "direct",
            "python-relay",
            "python-http-relay",
            "payonce-sqlite nokey",
            "payonce-sqlite keyed",
        )
        for load in ("20x50/s", "50x20/s")
    }
    for name, row in token_rate.items():
        (run,) = row["rounds"]
        assert run["answered"] == run["streams"], (name, run["failures"])
        # Counted by the load generator: 40 tokens (the prompt is sized for them)
        # plus the role chunk, the finish chunk and [DONE].
        assert run["events_per_stream"] == 43, name
        assert run["events"] == run["streams"] * 43
        assert run["gap_p99_ms"] is not None

    assert "| payonce-sqlite | keyed first call |" in done.stdout
    assert chart.read_text().startswith("<svg") and "payonce-sqlite" in chart.read_text()
