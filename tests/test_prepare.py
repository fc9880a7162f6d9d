"""``python -m tests.support.prepare``: what the suite needs, prepared before it runs.

Its ready path makes whole virtualenvs (minutes), so it is not run here: ``make
test`` runs it before every suite. These tests check that it knows every program
the tests install, and that a step it cannot do stops it with one line.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.support.apt import PROGRAMS

ROOT = Path(__file__).resolve().parents[1]


def _installed_calls() -> set[tuple[tuple[str, ...], str]]:
    """Every ``installed([...], "package", ...)`` in the tests: commands and package."""
    found = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or len(node.args) != 2:
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name != "installed":
                continue
            commands, package = node.args
            if isinstance(commands, ast.Name):  # a module constant, such as _BROWSERS
                commands = _constant(path, commands.id)
            found.add((tuple(ast.literal_eval(commands)), ast.literal_eval(package)))
    return found


def _constant(path: Path, name: str) -> ast.expr:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            return node.value
    raise AssertionError(f"{path}: no constant {name}")


def test_it_installs_every_program_the_tests_install() -> None:
    calls = _installed_calls()
    assert len(calls) >= 6, calls  # the scan finds them (redis, prometheus, gcc, wrk, ...)
    prepared = {(program.commands, program.package) for program in PROGRAMS}
    assert calls <= prepared, f"add to tests/support/apt.py's PROGRAMS: {calls - prepared}"


def test_a_step_it_cannot_do_stops_it_with_one_line(tmp_path: Path) -> None:
    # An empty PATH: redis-server is missing, and so is apt-get to install it.
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.prepare"],
        cwd=ROOT,
        env={**os.environ, "PATH": str(empty)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done
    *_, last = done.stdout.splitlines()
    assert last.startswith("prepare: redis-server (Debian package redis-server) FAILED: "), last
    assert "apt-get install -y redis-server" in last and "log: " in last, last
    log = Path(last.rsplit("log: ", 1)[1].rstrip(")"))
    assert "redis-server is missing" in log.read_text()
