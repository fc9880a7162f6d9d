"""--latency: the sim's syntax, and empirical files (plain seconds, or a payonce call log)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from payonce.errors import ConfigError
from payonce.simulate.config import parse_backoff
from payonce.simulate.latency import (
    EmpiricalDistribution,
    FixedDistribution,
    LogNormalDistribution,
    parse_distribution,
)


def test_the_sim_syntax() -> None:
    lognormal = parse_distribution("lognormal:p50=4s,p99=30s")
    assert isinstance(lognormal, LogNormalDistribution)
    assert lognormal.quantile(0.5) == pytest.approx(4.0)
    assert lognormal.quantile(0.99) == pytest.approx(30.0)
    assert lognormal.cdf(30.0) == pytest.approx(0.99)
    assert lognormal.describe() == "lognormal:p50=4s,p99=30s"
    draws = lognormal.sample(np.random.default_rng(1), 200_000)
    assert np.median(draws) == pytest.approx(4.0, rel=0.02)
    assert parse_distribution("fixed:250ms") == FixedDistribution(0.25)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gamma:k=2", "empirical:FILE"),
        ("lognormal:p50=4s", "missing p99"),
        ("lognormal:p50=4s,p99=1s", "p99 must be >= p50"),
        ("fixed:4", "needs a unit"),
        ("empirical:", "needs a file"),
        ("empirical:/no/such/file", "cannot read"),
    ],
)
def test_bad_latencies_name_the_flag(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as caught:
        parse_distribution(text)
    assert str(caught.value).startswith("--latency")


def test_a_file_of_seconds(tmp_path: Path) -> None:
    path = tmp_path / "latencies.txt"
    path.write_text("# seconds, one per line\n1\n2.5\n\n4\n10\n", encoding="utf-8")
    distribution = parse_distribution(f"empirical:{path}")
    assert isinstance(distribution, EmpiricalDistribution)
    assert distribution.values == (1.0, 2.5, 4.0, 10.0)
    assert distribution.cdf(2.5) == 0.5
    assert distribution.quantile(0.5) == 2.5
    assert distribution.quantile(0.99) == 10.0
    draws = distribution.sample(np.random.default_rng(2), 10_000)
    assert set(draws.tolist()) == {1.0, 2.5, 4.0, 10.0}


def test_a_payonce_call_log_gives_its_upstream_latencies(tmp_path: Path) -> None:
    lines = [
        {
            "outcome": "forwarded",
            "upstream_status": 200,
            "latency_ms": 1510,
            "upstream_latency_ms": 1500,
        },
        # A keyed call whose client left: still measured to its end, and counted.
        {
            "outcome": "forwarded",
            "upstream_status": 200,
            "status": 499,
            "upstream_latency_ms": 12000,
        },
        {"outcome": "passthrough", "upstream_status": 201, "upstream_latency_ms": 800},
        # Replays and joins waited for someone else's generation; failures and
        # cancelled calls did not measure one.
        {
            "outcome": "replayed",
            "upstream_status": 200,
            "latency_ms": 2,
            "upstream_latency_ms": None,
        },
        {"outcome": "joined", "upstream_status": 200, "latency_ms": 900},
        {"outcome": "forwarded", "upstream_status": 500, "upstream_latency_ms": 30},
        {
            "outcome": "passthrough",
            "upstream_status": None,
            "upstream_cancelled": True,
            "upstream_latency_ms": 4000,
        },
    ]
    path = tmp_path / "calls.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode()))
    distribution = parse_distribution(f"empirical:{path}")
    assert isinstance(distribution, EmpiricalDistribution)
    assert distribution.values == (1.5, 12.0, 0.8)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("1\nslow\n", ":2: 'slow' is not a number"),
        ("1\n-2\n", "latency must be >= 0"),
        ("# nothing\n", "no latencies found"),
        ('{"outcome": "forwarded"\n', ":1: not a JSON line"),
        ('{"outcome": "replayed", "upstream_status": 200}\n', "no latencies found"),
    ],
)
def test_bad_files(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=needle):
        parse_distribution(f"empirical:{path}")


def test_backoffs() -> None:
    assert parse_backoff("sdk", flag="--sdk-backoff").ceiling(5) == 8.0
    fixed = parse_backoff("300ms", flag="--app-backoff")
    assert (fixed.ceiling(0), fixed.ceiling(3), fixed.jitter) == (0.3, 0.3, 0.0)
    assert parse_backoff("fixed:1s", flag="--app-backoff") == parse_backoff("1s", flag="x")
    custom = parse_backoff("exp:initial=1s,max=30s,jitter=0.5", flag="--sdk-backoff")
    assert (custom.ceiling(0), custom.ceiling(2), custom.ceiling(9)) == (1.0, 4.0, 30.0)
    assert parse_backoff("none", flag="x").ceiling(4) == 0.0
    with pytest.raises(ConfigError, match=r"^--sdk-backoff: "):
        parse_backoff("exp:initial=1s,ceiling=3s", flag="--sdk-backoff")
    with pytest.raises(ConfigError, match=r"^--sdk-backoff"):
        parse_backoff("exp:jitter=2", flag="--sdk-backoff")
