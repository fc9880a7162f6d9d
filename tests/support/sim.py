"""A running ``payonce sim`` seen from a test: its URL, its ledger, a few requests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx

from tests.support.processes import Process, running

CHAT_BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello there friend"}]}


class Sim:
    """A running simulator: its URL, its ledger, and its log."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.url = process.url

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 10)
        return httpx.post(self.url + path, json=body, **kwargs)

    def chat(self, **kwargs: Any) -> httpx.Response:
        return self.post("/v1/chat/completions", CHAT_BODY, **kwargs)

    def ledger(self) -> dict[str, Any]:
        response = httpx.get(self.url + "/_sim/ledger", timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def billed(self) -> int:
        return int(self.ledger()["billed"])

    def requests(self) -> int:
        return int(self.ledger()["requests"])

    def reset(self) -> None:
        httpx.delete(self.url + "/_sim/ledger", timeout=10).raise_for_status()


@contextlib.contextmanager
def running_sim(*flags: str, log_dir: Path) -> Iterator[Sim]:
    """``payonce sim`` with ``flags`` on a free port, ready, and stopped on exit."""
    with running(["sim", *flags], log_dir=log_dir, ready_path="/_sim/health") as process:
        yield Sim(process)
