"""``payonce simulate`` end to end, through ``payonce.cli.main`` as the console runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from payonce.cli import main
from payonce.simulate.report import JSON_KEYS

DEMO = [
    "--latency", "lognormal:p50=4s,p99=30s", "--timeout", "10s", "--app-attempts", "2",
    "--app-backoff", "300ms", "--sdk-retries", "2", "--proxy-timeout", "8s", "--proxy-retries", "1",
]  # fmt: skip
# The demo's closed form (docs/simulate.md, worked example).
DEMO_DUPLICATE_RATIO = 0.3125


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(["simulate", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_has_exactly_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *DEMO, "--requests", "200000", "--seed", "1", "--json")
    assert code == 0, err
    document = json.loads(out)  # nothing but the JSON on stdout
    assert tuple(document) == JSON_KEYS
    assert set(JSON_KEYS) == {
        "billed_per_request", "duplicate_ratio", "success_rate", "latency_p50_s",
        "latency_p99_s", "wasted_usd_per_million", "recommended_timeout_s",
    }  # fmt: skip
    assert abs(document["duplicate_ratio"] - DEMO_DUPLICATE_RATIO) < 0.02
    assert document["billed_per_request"] == pytest.approx(1.4545, rel=0.02)
    assert document["recommended_timeout_s"] == pytest.approx(30.0)
    assert document["latency_p50_s"] == pytest.approx(4.0, rel=0.05)
    duplicates = document["billed_per_request"] - 1
    assert document["wasted_usd_per_million"] == pytest.approx(duplicates * 0.01 * 1e6, rel=1e-3)


def test_with_payonce_nothing_above_the_gateway_is_billed_twice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys, *DEMO, "--requests", "50000", "--seed", "2", "--payonce", "--json", "-"
    )
    assert code == 0
    document = json.loads(out)
    assert document["duplicate_ratio"] == 0.0
    assert document["billed_per_request"] == 1.0
    assert document["wasted_usd_per_million"] == 0.0
    code, out, _ = run(
        capsys,
        *DEMO,
        "--requests",
        "50000",
        "--seed",
        "2",
        "--payonce",
        "--proxy-below-payonce",
        "--json",
    )
    assert code == 0 and json.loads(out)["duplicate_ratio"] > 0.15


def test_the_table_and_a_json_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "figures.json"
    code, out, _ = run(capsys, *DEMO, "--requests", "20000", "--seed", "3", "--json", str(path))
    assert code == 0
    assert "duplicate ratio" in out and "with payonce" in out and "closed form" in out
    assert "31.25%" in out  # the closed form's line
    assert tuple(json.loads(path.read_text(encoding="utf-8"))) == JSON_KEYS


def test_the_seed_repeats_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    outputs = [
        run(capsys, *DEMO, "--requests", "5000", "--seed", "9", "--json")[1] for _ in range(2)
    ]
    assert outputs[0] == outputs[1]


def test_html_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "plot.html"
    args = ["--requests", "5000", "--plot-requests", "1000", "--seed", "4", "--html", str(path)]
    code, _, err = run(capsys, *DEMO, *args)
    assert code == 0, err
    page = path.read_text(encoding="utf-8")
    assert page.count("<svg") == 2
    assert "your timeout 10.0 s" in page and "with payonce" in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_an_empirical_latency_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "latencies.txt"
    path.write_text("3\n12\n", encoding="utf-8")
    code, out, err = run(
        capsys, "--latency", f"empirical:{path}", "--timeout", "10s", "--sdk-retries", "1",
        "--requests", "40000", "--seed", "5", "--json",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    # Half the attempts take 12 s and time out: 1 + 1/2 attempts, all billed.
    assert document["billed_per_request"] == pytest.approx(1.5, abs=0.02)
    assert document["success_rate"] == pytest.approx(0.75, abs=0.02)
    assert document["recommended_timeout_s"] == 12.0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--timeout", "soon"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--latency", "uniform:1s"], "--latency"),
        (["--app-attempts", "0"], "--app-attempts"),
        (["--sdk-retries", "two"], "--sdk-retries"),
        (["--proxy-retries", "-1"], "--proxy-retries"),
        (["--proxy-below-payonce"], "--proxy-below-payonce"),
        (["--fail", "1.5"], "--fail"),
        (["--sdk-backoff", "linear"], "--sdk-backoff"),
        (["--sdk-retry-on", "429"], "--sdk-retry-on"),
        (["--target-false-timeouts", "0"], "--target-false-timeouts"),
        (["--requests", "0"], "--requests"),
        (["--requests", "1e9"], "--requests"),
        (["--requests", "100000001"], "--requests"),
        (["--json", "/no/such/dir/out.json", "--requests", "10"], "--json"),
        (["--latency", "empirical:/no/such/file"], "--latency"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("payonce: error:") and needle in lines[0]


def test_the_console_script_lists_and_runs_simulate() -> None:
    # The real entry point, in its own process: help, and an error without a traceback.
    import subprocess
    import sys

    def payonce(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "payonce", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    assert "simulate" in payonce("--help").stdout
    assert "--proxy-below-payonce" in payonce("simulate", "--help").stdout
    result = payonce("simulate", "--deadline", "-1s")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("payonce: error: --deadline")
    assert "Traceback" not in result.stderr
