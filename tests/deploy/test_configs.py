"""deploy/compose.yaml and deploy/payonce.service, checked as far as this machine allows.

The compose file is read by podman-compose (its merged configuration) and its
shape checked here; Prometheus's configuration in it by promtool. The systemd
unit goes through ``systemd-analyze verify`` (no systemd runs here: it reads
the unit, its directives and its command).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import apt
from tests.support.container import PODMAN

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def test_podman_compose_reads_the_compose_file() -> None:
    # podman-compose 1.0 (Debian bookworm) has no `config`: --dry-run prints the
    # podman commands of `up` without running the containers (it does create the
    # project's network and volumes, removed after).
    command = apt.installed(("podman-compose",), "podman-compose", required=True)
    project = f"payonce-test-{uuid.uuid4().hex[:8]}"
    try:
        done = subprocess.run(
            [command, "--dry-run", "-p", project, "-f", str(DEPLOY / "compose.yaml"), "up", "-d"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=DEPLOY,
        )
    finally:
        for volume in ("payonce-data", "redis-data", "prometheus-data"):
            subprocess.run([*PODMAN, "volume", "rm", f"{project}_{volume}"], capture_output=True)
        subprocess.run([*PODMAN, "network", "rm", f"{project}_default"], capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {
        line.split("--name=")[1].split()[0]: line
        for line in done.stdout.splitlines()
        if line.startswith("podman run ")
    }
    assert set(runs) == {f"{project}_{s}_1" for s in ("gateway", "redis", "prometheus")}
    gateway = runs[f"{project}_gateway_1"]
    assert "--read-only" in gateway
    assert f"-v {project}_payonce-data:/var/lib/payonce" in gateway
    assert "-e PAYONCE_STORE=redis://redis:6379/0" in gateway
    assert "podman build -t localhost/payonce:latest -f ../deploy/Containerfile" in done.stdout


def test_the_gateway_runs_read_only_on_redis_with_its_volume_and_probe() -> None:
    compose = _compose()
    gateway = compose["services"]["gateway"]
    assert gateway["build"]["dockerfile"] == "deploy/Containerfile"
    assert (DEPLOY / gateway["build"]["context"] / gateway["build"]["dockerfile"]).exists()
    assert gateway["read_only"] is True
    assert gateway["environment"]["PAYONCE_STORE"] == "redis://redis:6379/0"
    assert gateway["environment"]["PAYONCE_CALL_LOG"].startswith("/var/lib/payonce/")
    assert "payonce-data:/var/lib/payonce" in gateway["volumes"]
    assert gateway["depends_on"] == ["redis"]
    for service in ("redis", "prometheus"):
        for volume in compose["services"][service]["volumes"]:
            source = volume.split(":")[0]
            assert source in compose["volumes"] or (DEPLOY / source).exists(), volume


def test_prometheus_in_compose_scrapes_the_gateway_with_the_rules(tmp_path: Path) -> None:
    promtool = apt.installed(("promtool",), "prometheus", required=True)
    # As mounted in the container: the configuration with the rules beside it.
    (tmp_path / "prometheus.yml").write_bytes((DEPLOY / "compose/prometheus.yml").read_bytes())
    (tmp_path / "prometheus-rules.yml").write_bytes((DEPLOY / "prometheus-rules.yml").read_bytes())
    done = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((DEPLOY / "compose/prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/_payonce/metrics"
    assert job["static_configs"][0]["targets"] == ["gateway:8080"]


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = apt.installed(("systemd-analyze",), "systemd", required=True)
    # verify checks that ExecStart's program exists: this test's payonce stands in
    # for /opt/payonce/bin/payonce.
    payonce = Path(sys.executable).parent / "payonce"
    assert payonce.exists()
    text = (DEPLOY / "payonce.service").read_text()
    assert "ExecStart=/opt/payonce/bin/payonce serve\n" in text
    unit = tmp_path / "payonce.service"
    unit.write_text(text.replace("/opt/payonce/bin/payonce", str(payonce)))
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


@pytest.mark.parametrize("name", ["PAYONCE_STORE", "PAYONCE_CALL_LOG"])
def test_the_unit_keeps_its_data_in_its_state_directory(name: str) -> None:
    text = (DEPLOY / "payonce.service").read_text()
    assert "StateDirectory=payonce\n" in text
    assert f"Environment={name}=" in text
    line = next(line for line in text.splitlines() if line.startswith(f"Environment={name}="))
    assert "/var/lib/payonce/" in line
