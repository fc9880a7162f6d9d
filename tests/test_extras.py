"""A command whose extra is not installed says which in one line, exit 2, before doing anything.

Two ways, both from the outside:

* in every run, fast: ``python -c`` runs the CLI as ``python -m payonce`` does,
  behind an import hook that makes the named modules missing (the
  ``ModuleNotFoundError`` of a plain install), one module at a time: which no
  single real install shows (rich installed, DuckDB not), and which caught the
  demo running its four stacks before it found DuckDB missing;
* slow, real: the wheel, built and installed without extras in a fresh
  virtualenv, where whatever pyproject.toml does not declare is really missing
  (the hook only hides what the test names).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from payonce.extras import EXTRAS
from tests.support.processes import Process, _wait_ready, free_port

ROOT = Path(__file__).resolve().parent.parent

# `python -c` with the modules of argv[1] (comma-separated) missing, then the CLI.
_WITHOUT = """
import sys

missing = frozenset(sys.argv.pop(1).split(","))


class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in missing:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Missing())
from payonce.cli import main

main()
"""

# Every optional dependency a command of the CLI may import.
OPTIONAL = ("anyio", "duckdb", "httpx2", "numpy", "openai", "opentelemetry", "rich")


def payonce_without(
    missing: tuple[str, ...], *args: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, ",".join(missing), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def needs(command: str, extra: str, module: str) -> str:
    return (
        f"payonce: error: payonce {command} needs the {extra} extra ({module} is missing):"
        f" pip install 'payonce[{extra}]'"
    )


def _command_args(command: str, tmp_path: Path) -> list[str]:
    """The command, with what it needs to start working in ``tmp_path``."""
    calls = tmp_path / "calls.jsonl"
    calls.write_text("")
    bill = tmp_path / "ledger.csv"
    bill.write_text("request_id,model\n")
    return {
        "demo": ["demo", "--requests", "1", "--output", str(tmp_path / "demo")],
        "reconcile": ["reconcile", "--calls", str(calls), "--bill", str(bill)],
        "simulate": ["simulate", "--requests", "10"],
    }[command]


@pytest.mark.parametrize(
    ("command", "module"),
    [
        ("demo", "openai"),
        ("demo", "httpx2"),
        ("demo", "rich"),
        ("demo", "duckdb"),
        ("reconcile", "duckdb"),
        ("reconcile", "rich"),
        ("simulate", "numpy"),
        ("simulate", "rich"),
    ],
)
def test_a_missing_module_names_the_extra_in_one_line(
    tmp_path: Path, command: str, module: str
) -> None:
    result = payonce_without((module,), *_command_args(command, tmp_path), cwd=tmp_path)
    assert one_line(result) == needs(command, command, module)
    # Before any work: the demo has not started its stacks (their files go there).
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize(
    "command",
    ["serve", "sim", "reconcile", "lint", "demo", "simulate", "tenant-id", "encryption-key"],
)
def test_help_needs_no_extra(tmp_path: Path, command: str) -> None:
    result = payonce_without(OPTIONAL, command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: payonce {command}")


def test_every_extra_a_command_asks_for_is_declared_in_pyproject() -> None:
    # A command's line names an extra; pip installs what pyproject.toml declares.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = {
            re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("-", "_")
            for requirement in declared.get(extra, [])
        }
        lacking = sorted(set(modules) - names)
        assert not lacking, f"pyproject.toml: the {extra} extra lacks {lacking}"


@pytest.mark.slow
def test_a_plain_install_of_the_wheel_runs_or_names_the_extra(tmp_path: Path) -> None:
    # The source copied first: building in the checkout would leave build/ there,
    # and two builds at once (pytest -n) would share it.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    # uv, as make installs it, and the releases uv.lock pins: what is tested is
    # what the lock holds, not whatever the index serves today.
    uv = ROOT / ".venv" / "uv" / "bin" / "uv"
    assert uv.exists(), f"{uv} is missing: run make setup"
    quiet = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    constraints = tmp_path / "constraints.txt"
    subprocess.run(
        [uv, "export", "--frozen", "--all-extras", "--no-emit-project", "--no-hashes",
         "--quiet", "--project", ROOT, "-o", constraints],
        check=True, timeout=120, env=quiet,
    )  # fmt: skip
    subprocess.run(
        [uv, "build", "--wheel", "--quiet", "--out-dir", tmp_path, source],
        check=True, timeout=300, env=quiet,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("payonce-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", python, "-c", constraints, wheel],
        check=True, timeout=600, env=quiet,
    )  # fmt: skip
    payonce = str(env_dir / "bin" / "payonce")  # the console script, as a user runs it
    # Only the virtualenv's own packages: nothing of this test run's.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [payonce, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=env,
            check=False,
        )

    for command in ("serve", "sim", "reconcile", "lint", "demo", "simulate"):
        assert run(command, "--help").returncode == 0, command
    assert re.fullmatch(r"[0-9a-f]{32}\n", run("tenant-id", stdin="sk-test\n").stdout)
    assert run("encryption-key").returncode == 0
    assert run("lint", str(source / "src" / "payonce" / "cli.py")).returncode == 0
    for command in ("demo", "reconcile", "simulate"):
        line = one_line(run(*_command_args(command, tmp_path)))
        found = re.fullmatch(re.escape(needs(command, command, "@")).replace("@", r"(\w+)"), line)
        assert found is not None, line
    assert not (tmp_path / "demo").exists()
    # The gateway and its simulator start on the runtime dependencies alone.
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        popen = subprocess.Popen(
            [payonce, "serve", "--store", "memory://", "--port", str(port),
             "--sim-port", str(free_port())],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )  # fmt: skip
    gateway = Process(popen, f"http://127.0.0.1:{port}", tmp_path / "serve.log")
    try:
        _wait_ready(gateway, "/_payonce/health", timeout=30)
    finally:
        assert gateway.stop() == 0, gateway.output()
