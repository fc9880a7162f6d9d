"""``payonce sim`` flags: a bad value of any flag is one line on stderr and exit code 2."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from payonce.sim.cli import sim_command
from tests.support.processes import free_port


def payonce_sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payonce", "sim", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--latency", "lognormal:p50=abc"], "--latency"),
        (["--fail", "500:2"], "--fail"),
        (["--port", "http"], "--port"),
        (["--token-rate", "50"], "--token-rate"),
        (["--die-mid-stream", "often"], "--die-mid-stream"),
    ],
)
def test_bad_flag_is_one_line_and_exit_2(args: list[str], flag: str) -> None:
    result = payonce_sim(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"error: {flag}" in lines[0].lower()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--latency", "lognormal:p50=abc"], "--latency"),
        (["--latency", "fixed:2"], "--latency"),
        (["--latency", "fixed:-1s"], "--latency"),
        (["--latency", "lognormal:p50=3s,p99=1s"], "--latency"),
        (["--latency", "gamma:1s"], "--latency"),
        (["--fail", "500"], "--fail"),
        (["--fail", "200:0.1"], "--fail"),
        (["--fail", "500:0.7,503:0.7"], "--fail"),
        (["--drop-after-compute", "1.5"], "--drop-after-compute"),
        (["--drop-after-compute", "half"], "--drop-after-compute"),
        (["--seed", "abc"], "--seed"),
        (["--port", "0"], "--port"),
        (["--port", "65536"], "--port"),
        (["--host", ""], "--host"),
        (["--token-rate", "fast"], "--token-rate"),
        (["--token-rate", "50"], "--token-rate"),
        (["--token-rate", "-1/s"], "--token-rate"),
        (["--token-rate", "50/min"], "--token-rate"),
        (["--die-mid-stream", "often"], "--die-mid-stream"),
        (["--die-mid-stream", "1.5"], "--die-mid-stream"),
        (["--die-mid-stream", "-0.1"], "--die-mid-stream"),
        (["--stored-responses", "lots"], "--stored-responses"),
    ],
)
def test_every_bad_value_names_its_flag(args: list[str], flag: str) -> None:
    result = CliRunner().invoke(sim_command, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: {flag}")
    assert len(result.stderr.splitlines()) == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_unwritable_ledger_is_exit_2() -> None:
    result = payonce_sim("--port", str(free_port()), "--ledger", "/no/such/dir/bill.csv")
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "--ledger: cannot open '/no/such/dir/bill.csv': No such file or directory"
    )
    assert "Traceback" not in result.stderr


def test_port_in_use_is_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = payonce_sim("--host", "127.0.0.1", "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"payonce: error: --port: cannot listen on 127.0.0.1:{port}: address already in use"
    ]


def test_help_shows_flags_and_defaults() -> None:
    result = CliRunner().invoke(sim_command, ["--help"])
    assert result.exit_code == 0
    for text in (
        "--latency",
        "lognormal:p50=1s,p99=10s",
        "--fail",
        "--drop-after-compute",
        "--token-rate",
        "50/s",
        "--die-mid-stream",
        "X-Sim-Token-Ms",
        "X-Sim-Die-After",
        "--keep-alive",
        "X-Sim-Keep-Alive-Ms",
        "--seed",
        "--ledger",
        "--stored-responses",
        "8100",
        "127.0.0.1",
    ):
        assert text in result.output
