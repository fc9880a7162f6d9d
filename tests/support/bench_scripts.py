"""Running a script of ``benchmarks/`` in its smallest form, as the quick benchmark tests do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.redis import redis_binaries

ROOT = Path(__file__).resolve().parents[2]


def run_with_redis(script: str, args: list[str], cwd: Path, timeout: float = 170) -> str:
    """Run ``benchmarks/<script>`` with ``args``; its standard output, or fail with its end.

    The apt helper may have put redis-server where PATH does not look: its folder
    goes first on the script's PATH.
    """
    server, _ = redis_binaries()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env={**os.environ, "PATH": f"{Path(server).parent}{os.pathsep}{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout
