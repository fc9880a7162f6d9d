"""Programs the tests drive (redis-server, chromium, promtool), installed with apt when missing.

CI runs as root on Debian, so a missing program is installed rather than its tests
skipped. Where installing is impossible (not root, no apt-get) the caller decides:
Redis tests fail (they must never skip), optional checks skip with the reason.
An attempted install that fails always fails the test, with apt's message.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

__all__ = ["installed"]

# apt-get takes dpkg's lock and fails at once when another apt-get (another test
# run, a parallel test worker, a benchmark installing nginx) holds it: wait instead.
_WAIT_FOR_LOCK = ["-o", "DPkg::Lock::Timeout=600"]
# apt-get update has no such option for its lists lock: our own runs take turns.
_OUR_LOCK = Path(tempfile.gettempdir()) / "payonce-tests-apt.lock"


def _find(commands: Sequence[str]) -> str | None:
    for command in commands:
        found = shutil.which(command)
        if found:
            return found
    return None


def installed(commands: Sequence[str], package: str, *, required: bool) -> str:
    """The path of the first of ``commands`` found, installing ``package`` if none is.

    When none is found and apt cannot be used, the test fails if ``required``, else
    it is skipped.
    """
    found = _find(commands)
    if found:
        return found
    hint = f"install it with `apt-get install -y {package}`"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        message = f"{commands[0]} is missing and cannot be installed here (needs root): {hint}"
        if required:
            pytest.fail(message)
        pytest.skip(message)
    with _OUR_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another run may have installed it while this one waited.
        if not _find(commands):
            _install(package, hint)
        fcntl.flock(lock, fcntl.LOCK_UN)
    found = _find(commands)
    if not found:
        pytest.fail(f"{commands[0]} is still missing after installing {package}: {hint}")
    return found


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
            pytest.fail(f"could not install {package} ({hint}):\n{done.stderr[-2000:]}")
