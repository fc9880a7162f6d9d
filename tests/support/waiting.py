"""Waiting for something to happen in another process, by polling what it shows.

The timeout is a safety net far past when the thing should happen (a stall of
several seconds), never a measure of how fast it happened: a busy machine only
makes the wait longer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` every 20 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)
