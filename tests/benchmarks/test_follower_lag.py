"""``benchmarks/follower_lag.py`` in its smallest form, so that the script cannot rot.

One stream per store, a follower on a second gateway joining 0.3 s in. Nothing
bounds a timing: the follower got every event the first client got, and some
of them after it joined (so lags were measured).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench_scripts import run_with_redis

pytestmark = [pytest.mark.bench, pytest.mark.timeout(180)]


def test_follower_lag_quick_run(tmp_path: Path) -> None:
    output = tmp_path / "lag.json"
    stdout = run_with_redis(
        "follower_lag.py",
        [
            *("--streams", "1", "--tokens", "30", "--token-rate", "20", "--join", "0.3"),
            *("--json", str(output)),
        ],
        tmp_path,
    )
    rows = json.loads(output.read_text())
    assert set(rows) == {"sqlite-this", "redis-this"}
    for name, lags in rows.items():
        assert lags["missing"] == [], f"{name}: the follower missed events"
        assert len(lags["join"]) + len(lags["after"]) > 10, name
    assert "first second after the join" in stdout
