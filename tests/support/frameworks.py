"""The frameworks of docs/recipes.md, each where its recipe runs: pinned virtualenvs and the Node SDK.

None of them is a dependency of payonce. Like LiteLLM's proxy
(``tests/support/litellm.py``), each set lives in its own folder under
``.venv/recipes/``, made once from a lock with every package's hashes
(``tests/support/recipes/*.txt``, made by ``uv pip compile --generate-hashes``
from the ``.in`` beside it; the command is at the top of each lock) and reused
while the lock is the same:

- ``frameworks``: LangChain (OpenAI and Anthropic), the LiteLLM SDK, the OpenAI
  Agents SDK and pydantic-ai, on the openai SDK 3.x (about 1 minute, 400 MB);
- ``openai2``: LlamaIndex and instructor, whose pins need the openai SDK 2.x;
- ``node-openai``: the openai Node SDK, installed by ``npm ci`` from
  ``recipes/package-lock.json`` (integrity hashes), no install scripts run.

A folder is complete once its ``.complete`` file exists; one that was
interrupted is made again from scratch, and older builds are removed. A build
holds a lock, so two test runs never build at once. A build that fails raises
with the last lines of its log: the tests that need it fail, never skip.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.litellm import _HARMLESS_PTH
from tests.support.locking import locked

__all__ = ["FRAMEWORKS", "NODE", "OPENAI2", "Installation", "NodeSDK", "VirtualEnv", "prepare"]

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".venv" / "recipes"
HERE = Path(__file__).with_name("recipes")
PIP = Path(__file__).with_name("pip_requirements.txt")  # installed first (why: in it)


@dataclass(frozen=True)
class Installation:
    """A folder ready to run recipes from."""

    path: Path
    created: bool  # this call made it
    seconds: float  # how long making it took (0 when reused)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


@dataclass(frozen=True)
class VirtualEnv:
    """A Python virtualenv made from a hashed lock."""

    name: str
    lock: Path
    pins: Mapping[str, str]  # distributions whose installed version is checked
    about: str  # how long and how big, told before a build

    @property
    def home(self) -> Path:
        return HOME / self.name

    @property
    def log(self) -> Path:
        return self.home / "install.log"

    def digest(self) -> str:
        return hashlib.sha256(PIP.read_bytes() + self.lock.read_bytes()).hexdigest()[:12]

    def commands(self, target: Path) -> list[list[str]]:
        python = str(target / "bin" / "python")
        pip_install = [python, "-m", "pip", "install", "--no-input", "--require-hashes"]
        # pip first, then every package pinned with its hashes: nothing but what was locked.
        return [
            [sys.executable, "-m", "venv", str(target)],
            [*pip_install, "-r", str(PIP)],
            [*pip_install, "-r", str(self.lock)],
        ]

    def check(self, target: Path) -> None:
        python = str(target / "bin" / "python")
        for name, pinned in self.pins.items():
            version = subprocess.run(
                [python, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
            if version != pinned:
                raise RuntimeError(f"installed {name} {version}, pinned {pinned}")
        hooks = [
            pth
            for pth in target.glob("lib/python*/site-packages/*.pth")
            if pth.name not in _HARMLESS_PTH and "import" in pth.read_text(errors="replace")
        ]
        if hooks:
            raise RuntimeError(f"startup hooks in {self.name}'s virtualenv, not run: {hooks}")


@dataclass(frozen=True)
class NodeSDK:
    """An npm project installed by ``npm ci`` from its lock."""

    name: str
    project: Path  # holds package.json and package-lock.json
    pins: Mapping[str, str]
    about: str

    @property
    def home(self) -> Path:
        return HOME / self.name

    @property
    def log(self) -> Path:
        return self.home / "install.log"

    def digest(self) -> str:
        files = (self.project / "package.json", self.project / "package-lock.json")
        return hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()[:12]

    def commands(self, target: Path) -> list[list[str]]:
        target.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(self.project / name, target / name)
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm not found: the Node SDK's tests need node and npm")
        # ci: exactly the lock, each tarball checked against its integrity hash.
        return [[npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", str(target)]]

    def check(self, target: Path) -> None:
        import json

        for name, pinned in self.pins.items():
            found = json.loads((target / "node_modules" / name / "package.json").read_text())
            if found["version"] != pinned:
                raise RuntimeError(f"installed {name} {found['version']}, pinned {pinned}")


FRAMEWORKS = VirtualEnv(
    "frameworks",
    HERE / "frameworks.txt",
    {
        "openai": "3.60.0",
        "anthropic": "2.17.0",
        "langchain-openai": "1.8.1",
        "langchain-anthropic": "1.7.10",
        "litellm": "1.108.7",
        "openai-agents": "0.24.0",
        "pydantic-ai-slim": "2.68.0",
    },
    "about 1 minute, 400 MB from PyPI",
)
OPENAI2 = VirtualEnv(
    "openai2",
    HERE / "openai2.txt",
    {"openai": "2.54.0", "llama-index-llms-openai": "0.8.3", "instructor": "1.17.0"},
    "about 1 minute, 300 MB from PyPI",
)
NODE = NodeSDK("node-openai", HERE, {"openai": "6.49.0"}, "seconds, 10 MB from npm")


def prepare(what: VirtualEnv | NodeSDK, say: Callable[[str], object] = print) -> Installation:
    """``what``'s folder, made when missing (raises with its log's tail when it cannot be)."""
    target = what.home / what.digest()
    what.home.mkdir(parents=True, exist_ok=True)
    with locked(what.home / ".lock"):
        if (target / ".complete").exists():
            return Installation(target, created=False, seconds=0.0)
        for stale in what.home.iterdir():  # older locks, or this one half made
            if stale.is_dir():
                shutil.rmtree(stale)
        started = time.monotonic()
        say(f"prepare: installing {what.name} into {target}, once ({what.about}); log: {what.log}")
        with what.log.open("wb") as out:
            for command in what.commands(target):
                done = subprocess.run(
                    command, stdout=out, stderr=subprocess.STDOUT, timeout=1800, check=False
                )
                if done.returncode != 0:
                    tail = what.log.read_text(errors="replace")[-4000:]
                    raise RuntimeError(
                        f"{what.name}: {' '.join(command[:4])} failed ({done.returncode}):\n{tail}"
                    )
        what.check(target)
        (target / ".complete").touch()
        return Installation(target, created=True, seconds=time.monotonic() - started)
