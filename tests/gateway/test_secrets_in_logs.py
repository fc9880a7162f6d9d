"""Secrets an operator configures never reach the gateway's log or its error messages."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx

from tests.support.processes import free_port, start_payonce
from tests.support.redis import command, redis_binaries
from tests.support.sim import Sim

PASSWORD = "hunter2-store-secret"


def test_the_store_password_is_not_logged(sim: Sim, tmp_path: Path) -> None:
    server, _ = redis_binaries()
    port = free_port()
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--requirepass", PASSWORD, "--dir", str(tmp_path)]
    redis = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        for _ in range(500):
            with contextlib.suppress(OSError):
                if "NOAUTH" in command(port, "PING"):  # up, and wants the password
                    break
            time.sleep(0.02)
        store = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
        gateway = start_payonce(
            ["serve", "--upstream", sim.url, "--store", store],
            log_dir=tmp_path,
            ready_path="/_payonce/health",
        )
        try:
            health = httpx.get(gateway.url + "/_payonce/health", timeout=5)
            assert health.json() == {"status": "ok", "store": "ok"}
        finally:
            gateway.stop()
        assert "redis://" in gateway.output()
        assert PASSWORD not in gateway.output(), gateway.output()
    finally:
        redis.kill()
        redis.wait(10)


def test_a_bad_store_url_is_reported_without_its_password() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "payonce", "serve", "--store", f"redis://:{PASSWORD}@h:port/0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "bad port" in done.stderr
    assert PASSWORD not in done.stderr + done.stdout
