"""``--dedupe-identical``: retries nobody declares, caught by their identical body.

An application's own retry loop (or a retrying proxy in front of the gateway) sends
the same request again with no key and no SDK header. With the option, a request
identical to one running or answered within the window joins or replays it. Off
by default: two business requests with one body would get one answer. A real
gateway and simulator; plain HTTP as the application.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import orjson

from tests.gateway.conftest import AUTH, CHAT, GatewayFactory, Sim


def _post(url: str, body: dict[str, object] | None = None, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json=body or CHAT,
        headers={**AUTH, "X-Sim-Delay-Ms": "1500"},
        timeout=timeout,
    )


def test_an_application_loop_that_retries_without_a_key_is_billed_once(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.jsonl"
    gateway = start_gateway("--no-otel", "--dedupe-identical", "30s", "--call-log", str(calls))
    # The loop gives up after 0.5 s and sends the same request again, twice.
    for _ in range(2):
        with contextlib.suppress(httpx.TimeoutException):
            _post(gateway.url, timeout=0.5)
    answer = _post(gateway.url)
    assert answer.status_code == 200
    assert fresh_sim.billed() == 1, "the repeats joined the first run or replayed it"
    assert _post(gateway.url).headers["idempotent-replayed"] == "true"
    other = _post(gateway.url, {**CHAT, "max_tokens": 5})
    assert other.headers.get("idempotent-replayed") != "true", "another body is another call"
    assert fresh_sim.billed() == 2
    gateway.stop()
    lines = [orjson.loads(line) for line in calls.read_bytes().splitlines()]
    assert {line["sdk_match"] for line in lines} == {"identical"}


def test_without_the_option_identical_requests_are_each_billed(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--no-otel")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        statuses = [r.status_code for r in pool.map(lambda _: _post(gateway.url), range(2))]
    assert statuses == [200, 200]
    assert fresh_sim.billed() == 2


def test_a_window_shorter_than_a_second_is_a_one_line_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "payonce", "serve", "--dedupe-identical", "0.5s"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--dedupe-identical: must be at least 1s" in done.stderr
    assert "Traceback" not in done.stderr
