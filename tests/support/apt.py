"""Programs the tests drive (redis-server, chromium, promtool), installed with apt when missing.

CI runs as root on Debian, so a missing program is installed rather than its tests
skipped. Where installing is impossible (not root, no apt-get) the caller decides:
Redis tests fail (they must never skip), optional checks skip with the reason.
An attempted install that fails always fails the test, with apt's message.

``installed()`` is for tests; ``ensure()`` the same without pytest, for
``python -m tests.support.prepare``, which installs all of ``PROGRAMS`` first.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PROGRAMS", "Program", "Unavailable", "ensure", "find", "installed", "usable"]

# apt-get takes dpkg's lock and fails at once when another apt-get (another test
# run, a parallel test worker, a benchmark installing nginx) holds it: wait instead.
_WAIT_FOR_LOCK = ["-o", "DPkg::Lock::Timeout=600"]
# apt-get update has no such option for its lists lock: our own runs take turns.
_OUR_LOCK = Path(tempfile.gettempdir()) / "payonce-tests-apt.lock"


@dataclass(frozen=True)
class Program:
    """A program the suite runs, the Debian package that has it, and who needs it."""

    commands: tuple[str, ...]  # any one of them will do
    package: str
    required: bool  # its tests fail without it; the others skip
    why: str


# Every program the tests get through installed(), for ``python -m
# tests.support.prepare`` to install before a run (tests/test_prepare.py checks
# that no call is missing here), and the compiler that builds llama-cpp-python.
PROGRAMS = (
    Program(("redis-server",), "redis-server", True, "the Redis store's tests"),
    Program(("redis-cli",), "redis-server", True, "the Redis store's tests"),
    Program(("pg_ctlcluster",), "postgresql", True, "the PostgreSQL store's tests"),
    Program(("pgbouncer",), "pgbouncer", True, "the PostgreSQL store through PgBouncer"),
    Program(("prometheus",), "prometheus", True, "the Prometheus and dashboard tests"),
    Program(("promtool",), "prometheus", True, "the Prometheus and dashboard tests"),
    Program(("gcc",), "gcc", True, "the SQLite store's tests on a slow disk"),
    Program(("c++", "g++"), "g++", True, "building llama-cpp-python (tests/upstreams)"),
    Program(("wrk",), "wrk", True, "the benchmarks' quick run"),
    Program(("podman",), "podman", True, "the container image's test (tests/deploy)"),
    Program(("runc",), "runc", True, "the container image's test (tests/deploy)"),
    Program(("mmdebstrap",), "mmdebstrap", True, "the container image's Debian base"),
    Program(("podman-compose",), "podman-compose", True, "checking deploy/compose.yaml"),
    Program(("systemd-analyze",), "systemd", True, "checking deploy/payonce.service"),
    Program(
        ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"),
        "chromium",
        False,
        "rendering the reconciliation report's HTML",
    ),
)


class Unavailable(RuntimeError):
    """The program is missing and apt cannot install it here (not root, or no apt-get)."""


def find(commands: Sequence[str]) -> str | None:
    """The path of the first of ``commands`` on the PATH."""
    for command in commands:
        found = shutil.which(command)
        if found:
            return found
    return None


def usable() -> bool:
    """Whether apt-get can install packages here: as root, on Debian or the like."""
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def ensure(commands: Sequence[str], package: str) -> str:
    """The path of the first of ``commands`` found, installing ``package`` if none is.

    Raises :class:`Unavailable` when none is found and apt cannot be used here,
    and RuntimeError when installing fails or leaves them all missing.
    """
    found = find(commands)
    if found:
        return found
    hint = f"install it with `apt-get install -y {package}`"
    if not usable():
        raise Unavailable(
            f"{commands[0]} is missing and cannot be installed here (that needs apt-get, as root): {hint}"
        )
    with _OUR_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another run may have installed it while this one waited.
        if not find(commands):
            _install(package, hint)
        fcntl.flock(lock, fcntl.LOCK_UN)
    found = find(commands)
    if not found:
        raise RuntimeError(f"{commands[0]} is still missing after installing {package}: {hint}")
    return found


def installed(commands: Sequence[str], package: str, *, required: bool) -> str:
    """:func:`ensure` for a test: when apt cannot be used, the test fails if
    ``required``, else it is skipped; a failed install always fails it."""
    try:
        return ensure(commands, package)
    except Unavailable as exc:
        message, skip = str(exc), not required
    except RuntimeError as exc:
        message, skip = str(exc), False
    # Outside the handlers: the test's message is apt's, without a chained traceback.
    if skip:
        pytest.skip(message)
    pytest.fail(message)


def _install(package: str, hint: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", *_WAIT_FOR_LOCK, "install", "-y", "-qq", "--no-install-recommends"]
    install.append(package)
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        # The package lists of a fresh machine may be missing or stale.
        update = ["apt-get", *_WAIT_FOR_LOCK, "update", "-qq"]
        subprocess.run(update, env=env, capture_output=True, check=False)
        done = subprocess.run(
            install, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"could not install {package} ({hint}):\n{done.stderr[-2000:]}")
