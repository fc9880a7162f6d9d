"""The serve command's configuration: flags, PAYONCE_* variables, TOML files, one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import httpx2 as httpx
import pytest

from payonce import __version__, cli
from payonce.config import GatewaySettings
from tests.support.processes import running


def payonce(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "payonce", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
    )


def test_a_ttl_shorter_than_the_upstream_timeout_is_accepted() -> None:
    # A running call's record lives as long as its lease is renewed, whatever the
    # ttl (docs/gateway.md, "Expiry"): --ttl only bounds how long an answer is kept.
    settings = GatewaySettings(ttl=3, lease=1, upstream_timeout=10)
    assert settings.ttl < settings.upstream_timeout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["serve", "--ttl", "abc"], "--ttl"),
        (["serve", "--ttl", "1s"], "--ttl"),
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--max-body", "-3"], "--max-body"),
        (["serve", "--max-header-bytes", "100"], "--max-header-bytes"),
        (["serve", "--max-headers", "0"], "--max-headers"),
        (["serve", "--header-timeout", "0s"], "--header-timeout"),
        (["serve", "--body-timeout", "soon"], "--body-timeout"),
        (["serve", "--keep-alive-timeout", "0"], "--keep-alive-timeout"),
        (["serve", "--on-disconnect", "maybe"], "--on-disconnect"),
        (["serve", "--upstream", "ftp://x"], "--upstream"),
        (["serve", "--upstream", "http://"], "--upstream"),
        (["serve", "--store", "mysql://localhost/db"], "--store"),
        (["serve", "--store", "postgres://localhost"], "names no database"),
        (["serve", "--store", "postgresql://u:pw@localhost/db"], "PAYONCE_STORE_PASSWORD"),
        (["serve", "--store", "sqlite:///no/such/dir/p.db"], "--store"),
        (["serve", "--store", "sqlite:///./p.db?timeout=x"], "--store"),
        (["serve", "--tenant-header", "bad header"], "--tenant-header"),
        (["serve", "--credential-header", "bad:header"], "--credential-header"),
        (["serve", "--credential-header", "x-a", "--tenant-header", "x-t"], "--credential-header"),
        (["serve", "--config", "/no/such/file.toml"], "--config"),
        (["serve", "--bogus"], "--bogus"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_code_2(
    args: list[str], needle: str, tmp_path: Path
) -> None:
    result = payonce(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("payonce: error:") and needle in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_environment_variable_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    result = payonce("serve", env={"PAYONCE_WAIT_TIMEOUT": "soon"}, cwd=tmp_path)
    assert result.returncode == 2 and "--wait-timeout" in result.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("require_key = maybe", "not valid TOML"),
        ("colour = 'blue'", "unknown setting"),
        ("ttl = 'x'", "--ttl"),
    ],
)
def test_bad_config_files(tmp_path: Path, content: str, needle: str) -> None:
    config = tmp_path / "payonce.toml"
    config.write_text(content)
    result = payonce("serve", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2 and needle in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _requires_key(url: str) -> bool:
    response = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
    return response.status_code == 400 and "required" in response.json()["title"]


def test_settings_come_from_toml_then_env_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "payonce.toml"
    config.write_text(
        '[serve]\nrequire-key = true\nupstream = "http://127.0.0.1:9"\nstore = "memory://"\n'
    )
    with running(
        ["serve", "--config", str(config)], log_dir=tmp_path, ready_path="/_payonce/health"
    ) as gw:
        assert _requires_key(gw.url)
    monkeypatch.setenv("PAYONCE_REQUIRE_KEY", "false")  # children inherit the environment
    with running(
        ["serve", "--config", str(config)], log_dir=tmp_path, ready_path="/_payonce/health"
    ) as gw:
        assert not _requires_key(gw.url)
    with running(
        ["serve", "--config", str(config), "--require-key"],
        log_dir=tmp_path,
        ready_path="/_payonce/health",
    ) as gw:
        assert _requires_key(gw.url)


def test_scenario_settings_come_from_toml_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "payonce.toml"
    config.write_text(
        '[serve]\nupstream = "http://127.0.0.1:9"\nstore = "memory://"\n'
        'scenarios = ["invoice-summary", "refunds"]\n'
        'scenario-header = "Helicone-Property-Feature"\n'
        '[serve.credential-scenario]\n"t-batch" = "nightly-batch"\n'
    )

    def labels(gw_url: str) -> set[str]:
        text = httpx.get(gw_url + "/_payonce/metrics").text
        return set(
            re.findall(r'payonce_scenario_requests_total\{endpoint="chat",scenario="([^"]+)"', text)
        )

    with running(
        ["serve", "--config", str(config)], log_dir=tmp_path, ready_path="/_payonce/health"
    ) as gw:
        assert labels(gw.url) == {"invoice-summary", "refunds", "other", "none"}
    monkeypatch.setenv("PAYONCE_SCENARIOS", "nightly-batch,search")
    with running(
        ["serve", "--config", str(config)], log_dir=tmp_path, ready_path="/_payonce/health"
    ) as gw:
        assert labels(gw.url) == {"nightly-batch", "search", "other", "none"}


def test_unreachable_upstream_is_a_502_problem_after_connect_retries(tmp_path: Path) -> None:
    args = [
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        "memory://",
        "--connect-retries",
        "1",
    ]
    with running(args, log_dir=tmp_path, ready_path="/_payonce/health") as gw:
        response = httpx.post(
            gw.url + "/v1/chat/completions", json={"model": "m"}, headers={"Idempotency-Key": "k"}
        )
        assert response.status_code == 502
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["x-should-retry"] == "true"
        assert "cannot connect" in response.json()["detail"]
        status = httpx.get(gw.url + "/_payonce/requests/k")
        assert status.status_code == 404, "the key was released: a retry runs again"


def test_version_and_help() -> None:
    assert payonce("--version").stdout == f"payonce {__version__}\n"
    help_text = payonce("serve", "--help").stdout
    assert "--upstream" in help_text and "PAYONCE_" in help_text


def test_the_cli_does_not_import_what_only_one_command_needs() -> None:
    # `payonce serve` (and every worker) starts through payonce.cli: the openai SDK
    # (demo), numpy (simulate) and DuckDB (reconcile) would add a second to each start.
    code = (
        "import sys, payonce.cli; "
        "print(sorted(m for m in ('openai', 'numpy', 'duckdb') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_the_version_is_the_same_in_pyproject_the_package_and_the_lock() -> None:
    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
    lock = tomllib.loads((root / "uv.lock").read_text())
    (locked,) = [p for p in lock["package"] if p["name"] == "payonce"]
    assert locked["version"] == __version__, "uv sync --locked refuses a stale lock"
    changelog = (root / "CHANGELOG.md").read_text()
    assert f"## [{__version__}] - " in changelog


def test_the_demo_help_names_the_incident() -> None:
    help_text = payonce("demo", "--help").stdout
    assert "article" not in help_text
    assert "31% of its bill was duplicate generations" in " ".join(help_text.split())


def test_every_option_of_every_command_says_what_it_does() -> None:
    """--help and the docs site's CLI reference show each option's help text."""
    (group,) = [value for value in vars(cli).values() if isinstance(value, click.Group)]
    silent = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")
            return
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                silent.append(f"{path} {param.opts[0]}")

    walk(group, "payonce")
    assert silent == []
