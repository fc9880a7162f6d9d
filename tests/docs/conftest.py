"""Fixtures of the docs code blocks: one real gateway (simulated upstream) per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.runner import Workspace
from tests.support.processes import Process, start_payonce


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """``payonce serve --upstream sim`` on free ports, its store in memory: what the
    blocks that talk to http://127.0.0.1:8080 talk to instead."""
    from tests.support.processes import free_port

    process = start_payonce(
        ["serve", "--upstream", "sim", "--sim-port", str(free_port()), "--store", "memory://"],
        log_dir=tmp_path_factory.mktemp("gateway"),
        ready_path="/_payonce/health",
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    """The temporary folder a block runs in (the checkout's entries linked in)."""
    return Workspace.make(tmp_path)
