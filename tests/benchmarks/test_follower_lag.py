"""``benchmarks/follower_lag.py`` in its smallest form, so that the script cannot rot.

One stream per store, a follower on a second gateway joining 0.3 s in. Nothing
bounds a timing: the follower got every event the first client got, and some
of them after it joined (so lags were measured).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis import redis_binaries

pytestmark = [pytest.mark.bench, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


def test_follower_lag_quick_run(tmp_path: Path) -> None:
    server, _ = redis_binaries()
    output = tmp_path / "lag.json"
    done = subprocess.run(
        [
            *(sys.executable, str(ROOT / "benchmarks" / "follower_lag.py")),
            *("--streams", "1", "--tokens", "30", "--token-rate", "20", "--join", "0.3"),
            *("--json", str(output)),
        ],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
        cwd=tmp_path,
        # The apt helper may have put redis-server where PATH does not look.
        env={**os.environ, "PATH": f"{Path(server).parent}{os.pathsep}{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(output.read_text())
    assert set(rows) == {"sqlite-this", "redis-this"}
    for name, lags in rows.items():
        assert lags["missing"] == [], f"{name}: the follower missed events"
        assert len(lags["join"]) + len(lags["after"]) > 10, name
    assert "first second after the join" in done.stdout
