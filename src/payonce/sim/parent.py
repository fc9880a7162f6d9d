"""The embedded simulator ends with the gateway that started it.

``payonce serve --upstream sim`` (and ``--workers``' supervisor) start the
simulator as a child. A gateway killed with SIGKILL cannot stop it, and an
orphaned simulator kept ``--sim-port`` (8100) busy: the next ``make run``
failed with "address already in use". On Linux the kernel sends the child
SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), which the simulator takes
as any SIGTERM: a graceful stop, its ledger flushed. Elsewhere a task looks
every second whether the parent is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys

__all__ = ["PARENT_VARIABLE", "end_with_parent", "watch_parent"]

_PR_SET_PDEATHSIG = 1


# The gateway's pid, set by the gateway that starts the simulator (gateway/server.py).
PARENT_VARIABLE = "_PAYONCE_SIM_PARENT"


def end_with_parent() -> bool:
    """Ask the kernel for SIGTERM when the parent dies; False where it cannot (not Linux).

    Exits at once if the parent is already gone (it died before the request): the
    parent is not the pid the gateway passed in ``_PAYONCE_SIM_PARENT``, or, without
    it, is pid 1. The variable matters in a container, where the gateway itself
    is pid 1 (deploy/Containerfile).
    """
    parent = os.getppid()
    expected = os.environ.get(PARENT_VARIABLE, "")
    orphaned = parent != int(expected) if expected.isdigit() else parent == 1
    done = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            done = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    if orphaned or os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
    return done


async def watch_parent(period: float = 1.0) -> None:
    """Where the kernel cannot tell (not Linux): SIGTERM to self once the parent is gone."""
    parent = os.getppid()
    # A poll, not an event: nothing notifies a process of its parent's death here.
    while os.getppid() == parent:  # noqa: ASYNC110
        await asyncio.sleep(period)
    os.kill(os.getpid(), signal.SIGTERM)
