"""``make run`` and ``make demo`` leave the checkout clean; the demo's commands run as printed.

The Makefile's own recipe lines are run (``$(BIN)`` and ``$(VENV)`` as make expands
them) in a throwaway git repository holding this checkout's ``.gitignore``, with a
``.venv/bin/payonce`` that starts like the console script pip writes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parent.parent


def _recipe(target: str) -> list[str]:
    """The commands of one Makefile target, with make's variables expanded."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    commands = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        command = line.strip().lstrip("@")
        command = command.replace("$(BIN)", ".venv/bin").replace("$(VENV)", ".venv")
        assert "$(" not in command, command
        commands.append(command)
    return commands


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git repository with this checkout's .gitignore and a .venv/bin/payonce."""
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    script = tmp_path / ".venv" / "bin" / "payonce"
    script.parent.mkdir(parents=True)
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom payonce.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return tmp_path


def _untracked(checkout: Path) -> list[str]:
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in status.stdout.splitlines() if line != "?? .gitignore"]


def _env() -> dict[str, str]:
    # The payonce under test, wherever the suite imports it from; no payonce on PATH.
    path = os.pathsep.join(p for p in sys.path if p)
    bare = os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "payonce").exists()
    )
    return {**os.environ, "PYTHONPATH": path, "PATH": bare}


def test_make_run_leaves_no_untracked_file(checkout: Path) -> None:
    *setup, serve = _recipe("run")
    for command in setup:
        subprocess.run(command, shell=True, cwd=checkout, check=True)
    port, sim_port = free_port(), free_port()
    command = f"{serve} --port {port} --sim-port {sim_port}"
    proc = subprocess.Popen(
        shlex.split(command), cwd=checkout, env=_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/_payonce/health", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no gateway"
                time.sleep(0.2)
        request = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}',
            headers={
                "Authorization": "Bearer sk-demo",
                "Idempotency-Key": "order-42",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert (checkout / ".venv" / "run" / "payonce.db").exists(), "the store is under .venv/"
    assert _untracked(checkout) == []


@pytest.mark.slow
def test_make_demo_leaves_no_untracked_file_and_its_commands_run_as_printed(
    checkout: Path,
) -> None:
    (demo,) = _recipe("demo")
    done = subprocess.run(
        [*shlex.split(demo), "--requests", "20", "--runs", "A,B", "--time-scale", "0.02"],
        cwd=checkout, env=_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _untracked(checkout) == []
    printed = re.findall(r"^  (\S*payonce reconcile .*)$", done.stdout, re.MULTILINE)
    assert len(printed) == 2, done.stdout
    for command in printed:
        assert command.startswith(".venv/bin/payonce reconcile "), command
        html = checkout / shlex.split(command)[-1]
        html.unlink()  # made again by the command, as printed
        again = subprocess.run(
            shlex.split(command), cwd=checkout, env=_env(), capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert again.returncode == 0, f"{command}\n{again.stdout}\n{again.stderr}"
        assert html.read_text().lower().startswith("<!doctype html>")
    assert _untracked(checkout) == []
