"""Older releases of the official SDKs, each in its own pinned virtualenv.

payonce's own virtualenv has the newest openai (3.x, on httpx2) and anthropic
(2.x). ``payonce.auto``, ``payonce run`` and ``protect()`` also promise openai
1.x and 2.x (on httpx) and anthropic 1.x; ``tests/client/test_sdk_versions.py``
proves it in these virtualenvs, ``.venv/sdks/<name>-<hash of the pins>/``, each
made from ``sdk_requirements/<name>.txt`` (every package with its hashes, made
by the command at its top from the ``.in`` beside it) by ``python -m
tests.support.prepare``, in seconds, and reused while the pins stay the same.
A virtualenv is complete once its ``.complete`` file exists; a build that was
interrupted starts again. payonce itself is not installed there: the tests
put ``src/`` on ``PYTHONPATH``, and the pins hold what ``payonce.client`` needs.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.locking import locked

__all__ = ["HOME", "LOG", "SDKS", "Sdk", "prepare", "prepare_all"]

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".venv" / "sdks"
LOG = HOME / "install.log"
PINS = Path(__file__).with_name("sdk_requirements")
PIP = Path(__file__).with_name("pip_requirements.txt")  # installed first, as for LiteLLM


@dataclass(frozen=True)
class Sdk:
    """One pinned SDK release: its virtualenv's name, package and version."""

    name: str
    package: str
    version: str
    http: str  # the HTTP library it sends through

    @property
    def requirements(self) -> Path:
        return PINS / f"{self.name}.txt"

    def target(self) -> Path:
        digest = hashlib.sha256(PIP.read_bytes() + self.requirements.read_bytes())
        return HOME / f"{self.name}-{digest.hexdigest()[:12]}"

    @property
    def python(self) -> Path:
        return self.target() / "bin" / "python"


SDKS = (
    Sdk("openai1", "openai", "1.109.1", "httpx"),
    Sdk("openai2", "openai", "2.54.0", "httpx"),
    Sdk("anthropic1", "anthropic", "1.17.0", "httpx2"),
)


def prepare(sdk: Sdk, say: Callable[[str], object] = print) -> bool:
    """Build ``sdk``'s virtualenv when missing; True when this call built it (raises on failure)."""
    target = sdk.target()
    HOME.mkdir(parents=True, exist_ok=True)
    with locked(HOME / ".lock"):
        if (target / ".complete").exists():
            return False
        for stale in HOME.glob(f"{sdk.name}-*"):  # older pins, or this one half built
            if stale.is_dir():
                shutil.rmtree(stale)
        say(f"prepare: installing {sdk.package} {sdk.version} into {target} (seconds); log: {LOG}")
        pip = [str(sdk.python), "-m", "pip", "install", "--no-input", "--require-hashes"]
        with LOG.open("ab") as out:
            for command in (
                [sys.executable, "-m", "venv", str(target)],
                [*pip, "-r", str(PIP)],
                [*pip, "-r", str(sdk.requirements)],
            ):
                done = subprocess.run(
                    command, stdout=out, stderr=subprocess.STDOUT, timeout=900, check=False
                )
                if done.returncode != 0:
                    tail = LOG.read_text(errors="replace")[-4000:]
                    raise RuntimeError(f"{sdk.name}: {command[2:4]} failed:\n{tail}")
        installed = subprocess.run(
            [str(sdk.python), "-c", f"import {sdk.package}; print({sdk.package}.__version__)"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()
        if installed != sdk.version:
            raise RuntimeError(f"installed {sdk.package} {installed}, pinned {sdk.version}")
        (target / ".complete").touch()
        return True


def prepare_all(say: Callable[[str], object] = print) -> str:
    """Every SDK's virtualenv; what was done, for ``tests.support.prepare``."""
    built = [sdk.name for sdk in SDKS if prepare(sdk, say)]
    return f"installed {', '.join(built)}" if built else "ready"
