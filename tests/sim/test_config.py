"""Flag parsers: good values parse to the right model, bad ones raise a one-line ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest

from payonce.errors import ConfigError
from payonce.sim.config import (
    DEFAULT_LATENCY,
    SimConfig,
    describe_token_interval,
    parse_duration,
    parse_failures,
    parse_latency,
    parse_port,
    parse_rate,
    parse_seed,
    parse_token_rate,
)
from payonce.sim.faults import FaultPlan
from payonce.sim.latency import FixedLatency, LogNormalLatency


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("0ms", 0.0), ("250ms", 0.25), ("2s", 2.0), ("1.5s", 1.5), (".5s", 0.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, flag="--x") == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "abc", "5", "2 m", "-1s", "1h", "s", "1e3s", "nan", "9" * 400 + "s"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--x: "):
        parse_duration(text, flag="--x")


@pytest.mark.parametrize(
    ("text", "model"),
    [
        ("fixed:0", FixedLatency(0.0)),
        ("fixed:250ms", FixedLatency(0.25)),
        ("fixed:2s", FixedLatency(2.0)),
        ("lognormal:p50=3s,p99=30s", LogNormalLatency(3.0, 30.0)),
        ("lognormal:p99=30s,p50=3s", LogNormalLatency(3.0, 30.0)),
        ("lognormal:p50=200ms,p99=200ms", LogNormalLatency(0.2, 0.2)),
    ],
)
def test_latency_models(text: str, model: object) -> None:
    assert parse_latency(text) == model


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fixed",
        "fixed:",
        "fixed:2",
        "uniform:1s",
        "lognormal:p50=abc,p99=1s",
        "lognormal:p50=1s",
        "lognormal:p50=1s,p99=1s,p50=1s",
        "lognormal:p50=1s,p95=2s",
        "lognormal:p50=3s,p99=1s",
        "lognormal:p50=0,p99=1s",
    ],
)
def test_bad_latency_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--latency") as caught:
        parse_latency(text)
    assert "\n" not in str(caught.value)


def test_described_latency_parses_back_to_itself() -> None:
    for text in ("fixed:0", "fixed:250ms", "fixed:2s", "lognormal:p50=1s,p99=10s"):
        model = parse_latency(text)
        assert parse_latency(model.describe()) == model


def test_failures() -> None:
    plan = parse_failures("500:0.05,429:0.02,503:0.01")
    assert plan == FaultPlan(((500, 0.05), (429, 0.02), (503, 0.01)))
    assert plan.describe() == "500:0.05,429:0.02,503:0.01"
    assert parse_failures("none") == FaultPlan()
    assert parse_failures("") == FaultPlan()


@pytest.mark.parametrize(
    "text",
    [
        "500",
        "500:",
        "abc:0.1",
        "500:x",
        "500:1.5",
        "500:-0.1",
        "200:0.1",
        "600:0.1",
        "500:0.1,500:0.2",
        "500:0.6,429:0.6",
    ],
)
def test_bad_failures(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--fail"):
        parse_failures(text)


def test_rates_ports_seeds() -> None:
    assert parse_rate("0", flag="--r") == 0.0
    assert parse_rate("1", flag="--r") == 1.0
    assert parse_rate("0.25", flag="--r") == 0.25
    assert parse_port("8100") == 8100
    assert parse_seed("-3") == -3
    for bad in ("x", "-0.1", "1.01", "nan"):
        with pytest.raises(ConfigError, match=r"^--r: "):
            parse_rate(bad, flag="--r")
    for bad in ("0", "65536", "http", "80.5"):
        with pytest.raises(ConfigError, match=r"^--port: "):
            parse_port(bad)
    with pytest.raises(ConfigError, match=r"^--seed: "):
        parse_seed("1.5")


def test_config_from_flags_defaults() -> None:
    config = SimConfig.from_flags()
    assert config == SimConfig()
    assert (config.host, config.port) == ("127.0.0.1", 8100)
    assert config.latency == parse_latency(DEFAULT_LATENCY) == LogNormalLatency(1.0, 10.0)
    assert config.failures == FaultPlan()
    assert config.drop_after_compute == 0.0
    assert config.seed is None
    assert config.ledger_path is None
    assert config.token_interval == pytest.approx(0.02)  # 50/s
    assert config.die_mid_stream == 0.0
    assert config.stored_responses == 1000
    assert config.keep_alive == 0.0


def test_config_from_flags_parses_everything() -> None:
    config = SimConfig.from_flags(
        host="0.0.0.0",
        port="9000",
        latency="fixed:0",
        fail="500:0.1",
        drop_after_compute="0.2",
        seed="42",
        ledger="bill.csv",
        token_rate="100/s",
        die_mid_stream="0.3",
        stored_responses="5",
        keep_alive="250ms",
    )
    assert config == SimConfig(
        host="0.0.0.0",
        port=9000,
        latency=FixedLatency(0.0),
        failures=FaultPlan(((500, 0.1),)),
        drop_after_compute=0.2,
        seed=42,
        ledger_path=Path("bill.csv"),
        token_interval=0.01,
        die_mid_stream=0.3,
        stored_responses=5,
        keep_alive=0.25,
    )


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        ({"host": " "}, "--host"),
        ({"port": "99999"}, "--port"),
        ({"latency": "lognormal:p50=abc"}, "--latency"),
        ({"fail": "500:2"}, "--fail"),
        ({"drop_after_compute": "2"}, "--drop-after-compute"),
        ({"seed": "x"}, "--seed"),
        ({"ledger": ""}, "--ledger"),
        ({"token_rate": "fast"}, "--token-rate"),
        ({"die_mid_stream": "2"}, "--die-mid-stream"),
        ({"stored_responses": "-1"}, "--stored-responses"),
        ({"stored_responses": "many"}, "--stored-responses"),
        ({"keep_alive": "15"}, "--keep-alive"),
        ({"keep_alive": "2m"}, "--keep-alive"),
        ({"keep_alive": "61s"}, "--keep-alive"),
    ],
)
def test_config_from_flags_names_the_bad_flag(flags: dict[str, str], flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag}"):
        SimConfig.from_flags(**flags)


def test_config_is_frozen() -> None:
    config = SimConfig()
    with pytest.raises(AttributeError):
        config.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "interval"),
    [
        ("50/s", 0.02),
        ("1/s", 1.0),
        ("12.5/s", 0.08),
        (" 1000/s ", 0.001),
        ("0", 0.0),
        ("0/s", 0.0),
        ("inf", 0.0),
        ("INF", 0.0),
    ],
)
def test_token_rates(text: str, interval: float) -> None:
    assert parse_token_rate(text) == pytest.approx(interval)


@pytest.mark.parametrize(
    "text", ["", "fast", "50", "50/min", "-5/s", "/s", "nan", "1e3/s", "0.001/s", "9" * 400 + "/s"]
)
def test_bad_token_rates_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--token-rate: ") as caught:
        parse_token_rate(text)
    assert "\n" not in str(caught.value)


def test_described_token_rate_parses_back_to_itself() -> None:
    for text in ("50/s", "12.5/s", "inf"):
        interval = parse_token_rate(text)
        assert describe_token_interval(interval) == text
        assert parse_token_rate(describe_token_interval(interval)) == interval
    assert describe_token_interval(0.0) == "inf"
