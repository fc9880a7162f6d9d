"""Waiting for something to happen in another process, by polling what it shows.

The timeout is a safety net far past when the thing should happen (a stall of
several seconds), never a measure of how fast it happened: a busy machine only
makes the wait longer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx2 as httpx
import pytest


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` every 20 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def settled_record(
    base: str, key: str, headers: dict[str, str], timeout: float = 60.0
) -> dict[str, object]:
    """The record of ``key`` once it is no longer ``in_progress``, by long-polling its status.

    ``?wait=`` answers as soon as the record changes, and a stream's record changes
    with every new event (docs/gateway.md, "The gateway's own endpoints"): one poll
    is not the end of a stream, so ask again until the state settles.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"the record of {key!r} still in progress after {timeout:g} s")
        response = httpx.get(
            f"{base}/_payonce/requests/{key}?wait={min(left, 30):.1f}",
            headers=headers,
            timeout=min(left, 30) + 10,
        )
        document: dict[str, object] = response.json()
        if response.status_code != 200 or document.get("state") != "in_progress":
            return document
