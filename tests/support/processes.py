"""Start real payonce processes on free 127.0.0.1 ports for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A port nobody listens on right now (bind to 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """A running child process and the base URL it serves."""

    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        return self.popen.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def exited(self, lines: int = 40) -> str | None:
        """None while it runs; once it has exited, what a failing test should show.

        For example ``llama_cpp.server exited with status -11 (SIGSEGV); the last
        lines of its log (<path>):`` and those lines: a test that only says
        "Connection refused" hides that its server crashed.
        """
        code = self.popen.poll()
        if code is None:
            return None
        status = str(code)
        if code < 0:
            with contextlib.suppress(ValueError):
                status += f" ({signal.Signals(-code).name})"
        given = self.popen.args
        args = [str(arg) for arg in given] if isinstance(given, list | tuple) else [str(given)]
        program = args[2] if len(args) > 2 and args[1] == "-m" else Path(args[0]).name
        logged = self.output().splitlines()
        start = max(0, len(logged) - lines)
        # A Python program's crash (faulthandler's "Fatal Python error" and every
        # thread's stack) can be longer than the tail: shown whole, from a little before.
        crashes = [n for n, line in enumerate(logged) if line.startswith("Fatal Python error")]
        if crashes:
            start = min(start, max(0, crashes[-1] - 5))
        tail = "\n".join(logged[start:])
        return f"{program} exited with status {status}; the last lines of its log ({self.log}):\n{tail}"


def _wait_ready(
    proc: Process, ready_path: str, timeout: float, tls: ssl.SSLContext | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"process exited with {proc.popen.returncode}:\n{proc.output()}")
        try:
            with urllib.request.urlopen(proc.url + ready_path, timeout=1, context=tls) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"process not ready after {timeout}s:\n{proc.output()}")


def start_payonce(
    args: list[str],
    *,
    log_dir: Path,
    ready_path: str,
    port: int | None = None,
    timeout: float = 20.0,
    env: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> Process:
    """Run ``python -m payonce <args> --port <free port>`` and wait until it answers.

    ``env``: variables added to (or, with a value of ``""``, removed from) this
    process's environment. ``tls``: the process serves HTTPS; check it with this
    client context.
    """
    child_env = {**os.environ, **(env or {})}
    for name, value in (env or {}).items():
        if value == "":
            del child_env[name]
    port = port or free_port()
    log = log_dir / f"{args[0]}-{port}.log"
    with log.open("wb") as handle:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(
            [sys.executable, "-m", "payonce", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so stop() also ends its children
            env=child_env,
        )
    scheme = "https" if tls is not None else "http"
    proc = Process(popen=popen, url=f"{scheme}://127.0.0.1:{port}", log=log)
    _wait_ready(proc, ready_path, timeout, tls)
    return proc


@contextlib.contextmanager
def running(args: list[str], *, log_dir: Path, ready_path: str) -> Iterator[Process]:
    proc = start_payonce(args, log_dir=log_dir, ready_path=ready_path)
    try:
        yield proc
    finally:
        proc.stop()
