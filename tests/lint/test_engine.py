"""File discovery, default excludes, and the parallel path agreeing with the serial one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from payonce.lint import engine
from payonce.lint.engine import FileKind, discover, lint_paths
from payonce.lint.rules import RuleSelection
from tests.lint.conftest import FIXTURES


def test_discovery_kinds_and_excludes(tmp_path: Path) -> None:
    for name in [
        "a.py",
        "b.yaml",
        "c.yml",
        "nginx.conf",
        "site.conf",
        "README.md",
        ".venv/lib.py",
        "node_modules/x.py",
        "pkg.egg-info/y.py",
        "sub/__pycache__/z.py",
        "sub/d.py",
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    found = {
        Path(name).relative_to(tmp_path).as_posix(): kind
        for name, kind in discover([str(tmp_path)])
    }
    assert found == {
        "a.py": FileKind.PYTHON,
        "b.yaml": FileKind.YAML,
        "c.yml": FileKind.YAML,
        "nginx.conf": FileKind.NGINX,
        "site.conf": FileKind.NGINX,
        "sub/d.py": FileKind.PYTHON,
    }


def test_explicit_files_are_sniffed(tmp_path: Path) -> None:
    script = tmp_path / "deploy"
    script.write_text("#!/usr/bin/env python3\nfrom openai import OpenAI\nOpenAI(timeout=3)\n")
    result = lint_paths([str(script)], RuleSelection.build(["PO301"]))
    assert [finding.code for finding in result.findings] == ["PO301"]


def test_parallel_run_matches_serial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for copy in range(6):
        shutil.copytree(FIXTURES, tmp_path / f"copy{copy}")
    serial = lint_paths([str(tmp_path)], jobs=1)
    monkeypatch.setattr(engine, "PARALLEL_THRESHOLD", 2)
    monkeypatch.setattr(engine, "_CHUNK", 3)
    parallel = lint_paths([str(tmp_path)], jobs=2)
    assert parallel == serial
    assert len(serial.findings) > 6 * 10
