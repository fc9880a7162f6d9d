"""The release as a user gets it: the wheel and the sdist, built and installed into clean virtualenvs.

``uv build`` makes both from a copy of this checkout's sources; each goes into a fresh ``python -m venv``
with its dependencies from the package index, held to the versions of ``uv.lock``
(``uv export`` as constraints). From the wheel's install (``payonce[demo]``):
``payonce --version``, ``payonce serve`` (started, asked ``/_payonce/health``,
stopped), ``payonce demo --requests 50`` and ``payonce lint``; from the sdist's:
``payonce --version`` and ``payonce lint``. Nothing runs with this checkout on
``PYTHONPATH``: every command imports the installed package.

About 45 s here (2 cores, uv's cache warm from make setup): the builds 2 s, each install
2-3 s, the demo 25 s, the sdist's build and install 7 s (docs/development.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from payonce import __version__
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
LINTED = """\
import openai

client = openai.OpenAI(max_retries=5)
for attempt in range(3):
    try:
        client.chat.completions.create(model="gpt-4o-mini", messages=[])
        break
    except openai.APITimeoutError:
        continue
"""


def _uv() -> str:
    uv = Path(sys.prefix) / "uv" / "bin" / "uv"  # the Makefile's pinned uv
    assert uv.exists(), f"no uv at {uv}: make setup installs it"
    return str(uv)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, "UV_PYTHON_DOWNLOADS": "never"}


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
    return done


def _ok(args: list[str], cwd: Path, timeout: float = 300) -> str:
    done = _run(args, cwd, timeout)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The wheel, the sdist and the lock's versions as a constraints file."""
    out = tmp_path_factory.mktemp("dist")
    # From a copy, as in tests/test_extras.py: a build in the checkout would leave
    # src/payonce.egg-info there, and two builds at once (pytest -n) would share it.
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    _ok([_uv(), "build", "--python", sys.executable, "--out-dir", str(out), str(source)], ROOT)
    (wheel,) = out.glob(f"payonce-{__version__}-py3-none-any.whl")
    (sdist,) = out.glob(f"payonce-{__version__}.tar.gz")
    constraints = out / "constraints.txt"
    _ok(
        [_uv(), "export", "--frozen", "--no-hashes", "--no-emit-project", "--all-extras",
         "--quiet", "-o", str(constraints)],
        ROOT,
    )  # fmt: skip
    return wheel, sdist, constraints


def _venv(where: Path, requirement: str, constraints: Path) -> Path:
    _ok([sys.executable, "-m", "venv", str(where)], where.parent)
    python = where / "bin" / "python"
    _ok(
        [_uv(), "pip", "install", "--quiet", "--python", str(python), "-c", str(constraints),
         requirement],
        where.parent,
    )  # fmt: skip
    return where / "bin"


@pytest.mark.slow
def test_the_wheel_installs_and_serves_demos_and_lints(
    built: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    wheel, _, constraints = built
    started = time.monotonic()
    bin_ = _venv(tmp_path / "venv", f"payonce[demo] @ {wheel.as_uri()}", constraints)
    installed = time.monotonic() - started
    payonce = str(bin_ / "payonce")
    assert _ok([payonce, "--version"], tmp_path) == f"payonce {__version__}\n"
    where = _ok([str(bin_ / "python"), "-c", "import payonce; print(payonce.__file__)"], tmp_path)
    assert Path(where.strip()).is_relative_to(tmp_path / "venv"), where

    port, sim_port = free_port(), free_port()
    serve = subprocess.Popen(
        [payonce, "serve", "--upstream", "sim", "--store", "memory://", "--port", str(port),
         "--sim-port", str(sim_port)],
        cwd=tmp_path, env=_clean_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                url = f"http://127.0.0.1:{port}/_payonce/health"
                with urllib.request.urlopen(url, timeout=2) as response:
                    assert response.status == 200
                break
            except OSError:
                assert serve.poll() is None, f"payonce serve exited with {serve.returncode}"
                assert time.monotonic() < deadline, "payonce serve never answered"
                time.sleep(0.2)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        assert serve.wait(30) == 0

    demo = _ok([payonce, "demo", "--requests", "50", "--output", "demo"], tmp_path, timeout=600)
    assert demo.count("payonce reconcile --calls") == 5, demo
    assert (tmp_path / "demo" / "run-B" / "reconcile.html").exists()

    (tmp_path / "app.py").write_text(LINTED)
    lint = _run([payonce, "lint", "app.py"], tmp_path)
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "PO101" in lint.stdout, lint.stdout
    print(f"wheel: installed with [demo] in {installed:.1f} s")


@pytest.mark.slow
def test_the_sdist_installs_and_lints(built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, sdist, constraints = built
    bin_ = _venv(tmp_path / "venv", str(sdist), constraints)
    payonce = str(bin_ / "payonce")
    assert _ok([payonce, "--version"], tmp_path) == f"payonce {__version__}\n"
    (tmp_path / "app.py").write_text(LINTED)
    lint = _run([payonce, "lint", "app.py"], tmp_path)
    assert lint.returncode == 1 and "PO101" in lint.stdout, lint.stdout + lint.stderr
    assert _run([payonce, "lint", "--help"], tmp_path).returncode == 0
