"""Real Redis servers for tests: one standalone server, or a 3-master Redis Cluster.

Each server is a ``redis-server`` child process on a free 127.0.0.1 port with
its own directory, no persistence and no daemonizing, so tests never touch a
Redis that happens to run on this machine (:6379) and leave nothing behind.
When ``redis-server`` is missing it is installed with apt as root; otherwise the
tests fail with a message saying how to install it. They never skip: a suite
that silently skips its Redis tests proves nothing about Redis.

Use :func:`running_redis` and :func:`running_cluster` from session-scoped
fixtures (``tests/store/conftest.py`` has them).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apt import installed
from tests.support.tls import Certificates

__all__ = ["RedisCluster", "RedisServer", "redis_binaries", "running_cluster", "running_redis"]


def redis_binaries() -> tuple[str, str]:
    """Paths of ``redis-server`` and ``redis-cli``, installing them with apt when missing."""
    server = installed(["redis-server"], "redis-server", required=True)
    return server, installed(["redis-cli"], "redis-server", required=True)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port(*, bus: bool = False) -> int:
    """A free port; with ``bus``, one whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not bus or (port + 10000 <= 65535 and _port_is_free(port + 10000)):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def command(port: int, *args: str, timeout: float = 2.0) -> str:
    """Send one command over a raw socket (inline protocol) and return the reply text."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall((" ".join(args) + "\r\n").encode())
        reply = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
            header, crlf, rest = reply.partition(b"\r\n")
            if crlf and (header[:1] != b"$" or len(rest) >= int(header[1:]) + 2):
                break
        return reply.decode(errors="replace")


@dataclass
class RedisServer:
    """One ``redis-server`` process; :meth:`stop` and :meth:`start` keep its port."""

    port: int
    directory: Path
    cluster: bool = False
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # Also serve TLS on tls_port with these files (the plain port stays, for the tests).
    tls: Certificates | None = None
    tls_port: int = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        """``rediss://`` to the TLS port, trusting the test CA (redis-py's ``ssl_ca_certs``)."""
        assert self.tls is not None
        return f"rediss://127.0.0.1:{self.tls_port}/0?ssl_ca_certs={self.tls.ca}"

    @property
    def log(self) -> Path:
        return self.directory / f"redis-{self.port}.log"

    def start(self, timeout: float = 20.0) -> None:
        server, _ = redis_binaries()
        args = [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--daemonize", "no", "--dir", str(self.directory)]
        args += ["--logfile", str(self.log)]
        if self.tls is not None:
            args += ["--tls-port", str(self.tls_port), "--tls-cert-file", str(self.tls.cert)]
            args += ["--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca)]
            args += ["--tls-auth-clients", "no"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]
            args += ["--cluster-config-file", f"nodes-{self.port}.conf"]
        self.popen = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log.read_text(errors='replace')}")
            with contextlib.suppress(OSError):
                if command(self.port, "PING").startswith("+PONG"):
                    return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} not ready after {timeout}s")

    def stop(self) -> None:
        """Stop at once (SIGKILL): to clients it looks like a crash, and nothing is saved."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self.popen = None

    def flush(self) -> None:
        reply = command(self.port, "FLUSHALL")
        if not reply.startswith("+OK"):
            raise RuntimeError(f"FLUSHALL on port {self.port}: {reply!r}")


@dataclass
class RedisCluster:
    """Three masters, no replicas, every slot covered."""

    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def flush(self) -> None:
        for node in self.nodes:
            node.flush()


@contextlib.contextmanager
def running_redis(directory: Path, tls: Certificates | None = None) -> Iterator[RedisServer]:
    """A standalone Redis on a free port, stopped on exit; with ``tls``, TLS on another port."""
    server = RedisServer(_free_port(), directory, tls=tls, tls_port=_free_port() if tls else 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running_cluster(directory: Path, timeout: float = 30.0) -> Iterator[RedisCluster]:
    """A 3-master Redis Cluster on free ports, joined and ``cluster_state:ok``."""
    _, cli = redis_binaries()
    nodes: list[RedisServer] = []
    try:
        for _ in range(3):
            port = _free_port(bus=True)
            node = RedisServer(port, directory / str(port), cluster=True)
            node.directory.mkdir()
            nodes.append(node)
            node.start()
        create = [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes)]
        create += ["--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        deadline = time.monotonic() + timeout
        while not all("cluster_state:ok" in command(n.port, "CLUSTER", "INFO") for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ok after {timeout}s")
            time.sleep(0.05)
        yield RedisCluster(nodes)
    finally:
        for node in nodes:
            node.stop()
