"""Liveness and readiness, from the outside, against real gateway processes.

``/_payonce/health/live`` answers while the process does; ``/_payonce/health/ready``
is 503 from SIGTERM on (served for --shutdown-delay before the drain), and with
``?upstream=true`` when no connection to the upstream opens (docs/deploy.md).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.support.processes import Process, free_port, start_payonce
from tests.support.redis import running_redis
from tests.support.waiting import wait_until


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=10)


def test_live_and_ready_answer_and_the_old_health_still_does(tmp_path: Path) -> None:
    gateway = start_payonce(
        ["serve", "--upstream", "sim", "--sim-port", str(free_port()), "--store", "memory://"],
        log_dir=tmp_path,
        ready_path="/_payonce/health/ready",
    )
    try:
        live = _get(gateway.url + "/_payonce/health/live")
        assert (live.status_code, live.json()) == (200, {"status": "ok"})
        ready = _get(gateway.url + "/_payonce/health/ready")
        assert (ready.status_code, ready.json()) == (200, {"status": "ok", "store": "ok"})
        both = _get(gateway.url + "/_payonce/health/ready?upstream=true")
        assert both.status_code == 200
        assert both.json() == {"status": "ok", "store": "ok", "upstream": "ok"}
        bad = _get(gateway.url + "/_payonce/health/ready?upstream=maybe")
        assert bad.status_code == 400 and bad.json()["type"].endswith("#bad-query")
        old = _get(gateway.url + "/_payonce/health")
        assert (old.status_code, old.json()) == (200, {"status": "ok", "store": "ok"})
    finally:
        gateway.stop()


def test_ready_with_upstream_is_503_while_the_upstream_does_not_answer(tmp_path: Path) -> None:
    nobody = free_port()
    gateway = start_payonce(
        ["serve", "--upstream", f"http://127.0.0.1:{nobody}", "--store", "memory://"],
        log_dir=tmp_path,
        ready_path="/_payonce/health/live",
    )
    try:
        assert _get(gateway.url + "/_payonce/health/ready").status_code == 200
        ready = _get(gateway.url + "/_payonce/health/ready?upstream=1")
        assert ready.status_code == 503
        assert ready.json() == {"status": "unavailable", "store": "ok", "upstream": "unavailable"}
        assert _get(gateway.url + "/_payonce/health/live").status_code == 200
    finally:
        gateway.stop()


# Long enough that a slow machine still sees the delay at work (a test that waited
# 4.4 s for its first probes on a loaded machine missed a delay of 3 s).
DELAY = 10.0


def _delayed(tmp_path: Path, workers: int = 1) -> Process:
    return start_payonce(
        [
            "serve",
            "--workers",
            str(workers),
            "--upstream",
            "sim",
            "--sim-port",
            str(free_port()),
            "--store",
            f"sqlite:///{tmp_path / 'payonce.db'}",
            "--shutdown-delay",
            f"{DELAY:g}s",
        ],
        log_dir=tmp_path,
        ready_path="/_payonce/health/ready",
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_makes_ready_503_for_the_shutdown_delay_while_requests_are_served(
    tmp_path: Path, workers: int
) -> None:
    gateway = _delayed(tmp_path, workers)
    try:
        gateway.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # With workers, every one of them: the probe's connection may reach any.
        wait_until(
            lambda: all(
                _get(gateway.url + "/_payonce/health/ready").status_code == 503 for _ in range(8)
            ),
            "readiness to fail after SIGTERM",
        )
        ready = _get(gateway.url + "/_payonce/health/ready")
        assert ready.json() == {"status": "draining", "store": "ok"}
        assert _get(gateway.url + "/_payonce/health/live").status_code == 200
        # Still serving: the requests a load balancer sends before it notices.
        call = httpx.post(
            gateway.url + "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
            # At once: the built-in simulator's latency (p99 10 s) once took the
            # call past the delay, and the test failed for the draw, not the gateway.
            headers={
                "Authorization": "Bearer sk-test",
                "Idempotency-Key": "draining-1",
                "X-Sim-Delay-Ms": "0",
            },
            timeout=30,
        )
        assert call.status_code == 200
        assert time.monotonic() - signalled < DELAY, "the test was too slow to see the delay"
        assert gateway.popen.wait(DELAY + 20) == 0, gateway.output()
        assert time.monotonic() - signalled >= DELAY
    finally:
        gateway.stop()


def test_a_second_sigterm_during_the_delay_stops_the_gateway_at_once(tmp_path: Path) -> None:
    gateway = _delayed(tmp_path)
    try:
        gateway.popen.send_signal(signal.SIGTERM)
        wait_until(
            lambda: _get(gateway.url + "/_payonce/health/ready").status_code == 503,
            "readiness to fail after SIGTERM",
        )
        signalled = time.monotonic()
        gateway.popen.send_signal(signal.SIGTERM)
        assert gateway.popen.wait(20) == 0, gateway.output()
        assert time.monotonic() - signalled < DELAY / 2  # at once, not after the delay
    finally:
        gateway.stop()


@pytest.mark.parametrize(
    ("policy", "down"),
    [("closed", (503, "unavailable")), ("open", (200, "degraded"))],
)
def test_ready_follows_the_store_while_live_stays_200(
    tmp_path: Path, policy: str, down: tuple[int, str]
) -> None:
    with running_redis(tmp_path) as redis:
        gateway = start_payonce(
            [
                "serve",
                "--upstream",
                "sim",
                "--sim-port",
                str(free_port()),
                "--store",
                redis.url + "?timeout=0.5",
                "--on-store-failure",
                policy,
            ],
            log_dir=tmp_path,
            ready_path="/_payonce/health/ready",
        )
        try:
            redis.stop()
            ready = _get(gateway.url + "/_payonce/health/ready")
            assert (ready.status_code, ready.json()) == (
                down[0],
                {"status": down[1], "store": "unavailable"},
            )
            assert _get(gateway.url + "/_payonce/health/live").status_code == 200
            redis.start()
            wait_until(
                lambda: (
                    _get(gateway.url + "/_payonce/health/ready").status_code == 200
                    and _get(gateway.url + "/_payonce/health/ready").json()["status"] == "ok"
                ),
                "readiness once the store is back",
            )
        finally:
            gateway.stop()
