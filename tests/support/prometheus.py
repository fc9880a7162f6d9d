"""A real Prometheus for tests: Debian's ``prometheus`` package, on a free 127.0.0.1 port.

The package gives ``/usr/bin/prometheus`` and ``/usr/bin/promtool``; when they are
missing they are installed with the tests' apt helper (root, Debian's own archive).
Installing it also enables a ``prometheus.service`` on :9090; in a container without
systemd (CI, this project's machines) ``policy-rc.d`` keeps it from starting, and on a
machine where it does start it does not matter: the tests run their own Prometheus
binary on a free port with a data directory of their own, and stop it after.

The scrape config is ``deploy/prometheus.yml`` itself, rewritten only where a test
must differ (targets, a 1 s scrape and evaluation interval, the rules' path), so the
shipped file is the one proven. :func:`backfill` writes samples in the past with
``promtool tsdb create-blocks-from openmetrics`` before Prometheus starts (the "day
before" that the dashboard's and the rules' ``offset`` queries compare with).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

from tests.support.apt import installed
from tests.support.processes import Process, free_port

__all__ = [
    "DEPLOY",
    "Prometheus",
    "backfill",
    "binaries",
    "running_prometheus",
    "scrape_config",
]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def binaries() -> tuple[str, str]:
    """Paths of ``prometheus`` and ``promtool``, installed from Debian's package when missing."""
    prometheus = installed(["prometheus"], "prometheus", required=True)
    return prometheus, installed(["promtool"], "prometheus", required=True)


def scrape_config(targets: Sequence[str], rules: Path, *, interval: str = "1s") -> str:
    """``deploy/prometheus.yml`` pointed at ``targets``, scraping and evaluating every ``interval``.

    Text replacements, each of which must match exactly once: a change to the shipped
    file that moves one of them fails here rather than testing something else.
    """
    text = (DEPLOY / "prometheus.yml").read_text()
    replacements = [
        ("scrape_interval: 15s", f"scrape_interval: {interval}"),
        ("evaluation_interval: 15s", f"evaluation_interval: {interval}"),
        ("  - prometheus-rules.yml", f"  - {rules}"),
        ('- targets: ["127.0.0.1:8080"]', f"- targets: {json.dumps(list(targets))}"),
    ]
    for old, new in replacements:
        assert text.count(old) == 1, f"deploy/prometheus.yml no longer has {old!r} once"
        text = text.replace(old, new)
    return text


def backfill(promtool: str, openmetrics: str, data: Path, work: Path) -> None:
    """Write ``openmetrics`` (samples with timestamps, ending in ``# EOF``) as TSDB blocks."""
    source = work / "backfill.om"
    source.write_text(openmetrics)
    data.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@dataclass
class Prometheus:
    """A running Prometheus and its HTTP API."""

    process: Process
    url: str
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def api(self, path: str, params: Any) -> Any:
        """The ``data`` of a successful answer of the HTTP API at ``path``."""
        response = self.client.get(self.url + path, params=params)
        body = response.json()
        assert response.status_code == 200 and body.get("status") == "success", (
            f"{path} {params}: {response.status_code} {body}"
        )
        return body["data"]

    def query(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
        """An instant query at ``at`` (Unix seconds, millisecond precision): (labels, value)s."""
        data = self.api("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return [(dict(item["metric"]), float(item["value"][1])) for item in data["result"]]

    def samples(self, selector: str, at: float) -> list[tuple[dict[str, str], list[float]]]:
        """The raw sample timestamps of a range selector (``name[30s]``) evaluated at ``at``."""
        data = self.api("/api/v1/query", {"query": selector, "time": f"{at:.3f}"})
        assert data["resultType"] == "matrix", f"{selector}: {data['resultType']}"
        return [
            (dict(item["metric"]), [float(ts) for ts, _ in item["values"]])
            for item in data["result"]
        ]

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """What Grafana asks for a ``label_values(match, label)`` variable over a time range."""
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return [str(value) for value in self.api(f"/api/v1/label/{label}/values", params)]

    def rules(self) -> list[dict[str, Any]]:
        """Every rule Prometheus loaded, with its parsed ``query`` and ``health``."""
        groups = self.api("/api/v1/rules", {})["groups"]
        return [rule for group in groups for rule in group["rules"]]


def _wait_ready(process: Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(
                f"prometheus exited with {process.popen.returncode}:\n{process.output()}"
            )
        try:
            if httpx.get(process.url + "/-/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    process.stop()
    raise RuntimeError(f"prometheus not ready after {timeout}s:\n{process.output()}")


@contextmanager
def running_prometheus(
    config: str, work: Path, *, data: Path | None = None
) -> Iterator[Prometheus]:
    """Run ``prometheus`` with ``config`` (the text of a prometheus.yml) on a free port.

    ``promtool check config`` runs on it first (it also checks the rule files it names).
    """
    prometheus, promtool = binaries()
    config_path = work / "prometheus.yml"
    config_path.write_text(config)
    checked = subprocess.run(
        [promtool, "check", "config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    data = data or work / "data"
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = work / f"prometheus-{port}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process = Process(popen=popen, url=f"http://127.0.0.1:{port}", log=log)
    try:
        _wait_ready(process, 30)
        running = Prometheus(process, process.url)
        with running.client:
            yield running
    finally:
        process.stop()
