"""Seeing ``payonce serve --workers N`` from outside: its workers, and which one holds a connection.

Linux only (``/proc``): a worker is a child of the supervisor that is not the
simulator; the worker holding a client's connection is the process with a file
descriptor on the socket whose peer is the client's port.
"""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path

__all__ = ["Connection", "holder", "workers_of"]

CHAT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Say hello to every worker"}],
    "max_tokens": 16,
}


def workers_of(supervisor: int) -> list[int]:
    """The worker processes of a ``--workers`` supervisor (its children, simulator aside)."""
    found: list[int] = []
    for task in Path(f"/proc/{supervisor}/task").glob("*"):
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return [pid for pid in found if b"payonce\0sim" not in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _socket_inodes(server_port: int, client_port: int) -> set[str]:
    """Inodes of the server-side sockets of the connection from ``client_port``."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if (
                int(local.rsplit(":", 1)[1], 16) == server_port
                and int(remote.rsplit(":", 1)[1], 16) == client_port
            ):
                inodes.add(inode)
    return inodes


def holder(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` has accepted the connection from ``client_port`` (None: none yet)."""
    wanted = {f"socket:[{inode}]" for inode in _socket_inodes(server_port, client_port)}
    if not wanted:
        return None
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") in wanted:
                    return pid
            except OSError:
                continue
    return None


class Connection:
    """One HTTP/1.1 connection to the gateway, whose serving worker can be found."""

    def __init__(self, url: str, timeout: float = 30) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.http = http.client.HTTPConnection(host, self.port, timeout=timeout)
        self.http.connect()
        assert self.http.sock is not None
        self.client_port = int(self.http.sock.getsockname()[1])

    def send_chat(self, key: str | None, headers: dict[str, str] | None = None) -> None:
        sent = {"Authorization": "Bearer sk-test-workers", "Content-Type": "application/json"}
        if key is not None:
            sent["Idempotency-Key"] = key
        self.http.request(
            "POST", "/v1/chat/completions", json.dumps(CHAT), {**sent, **(headers or {})}
        )

    def answer(self) -> int:
        response = self.http.getresponse()
        response.read()
        return response.status

    def holder(self, pids: list[int]) -> int | None:
        return holder(self.port, self.client_port, pids)

    def close(self) -> None:
        self.http.close()
