"""The real processes a torture run drives: a simulator, one to three gateways, a store.

Every process is started the way an operator starts it (``payonce sim``,
``payonce serve``, ``redis-server``) on a free port of 127.0.0.1, with its output
in the run's folder. Gateways can be killed, stopped, terminated and restarted on
the same port, which is what the nemesis does to them.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from payonce.errors import ConfigError
from payonce.torture.postgres import LocalPostgres

__all__ = ["Cluster", "Node", "free_port"]

STORES = ("sqlite", "redis", "redis-cluster", "postgres", "memory")


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _redis_command(port: int, *args: str) -> bytes:
    """One command to a Redis on ``port`` (RESP), its raw reply."""
    message = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(arg.encode()), arg.encode()) for arg in args
    )
    with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
        connection.sendall(message)
        return connection.recv(65536)


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 < 65536:
            with contextlib.suppress(OSError), socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 10000))
                return port
    raise RuntimeError("no free port with a free cluster bus port")


def _wait_ready(
    port: int, path: str, process: subprocess.Popen[bytes], log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}:\n{tail}")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            connection.request("GET", path)
            connection.getresponse().read()
            return  # it answers
        except OSError:
            time.sleep(0.05)
        finally:
            connection.close()
    raise RuntimeError(f"port {port} did not answer within {timeout:g} s (log: {log})")


@dataclass
class Node:
    """One process that can be signalled and started again on its port."""

    name: str
    args: list[str]
    port: int
    folder: Path
    ready_path: str
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # None: this process's environment
    starts: int = 0
    stopped: bool = False
    killed: bool = False  # ever SIGKILLed: its buffered call-log lines may be lost
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.folder / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start it (again) and wait until it answers."""
        self.starts += 1
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                self.args, stdout=output, stderr=subprocess.STDOUT, cwd=self.folder, env=self.env
            )
        self.stopped = False
        _wait_ready(self.port, self.ready_path, self.process, self.log, timeout)

    def signal(self, number: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(number)
        if number == signal.SIGSTOP:
            self.stopped = True
        elif number == signal.SIGCONT:
            self.stopped = False
        elif number == signal.SIGKILL:
            self.killed = True

    def wait(self, timeout: float = 30.0) -> None:
        """Wait for it to exit (after SIGTERM or SIGKILL); SIGKILL it past ``timeout``."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait()

    def rss_bytes(self) -> int | None:
        """Its resident memory now, from /proc (``None`` elsewhere or when gone)."""
        if self.process is None:
            return None
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None

    def stop(self) -> None:
        """End it for good: SIGCONT if stopped, SIGTERM, then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        self.wait(15.0)


class Cluster:
    """A simulator, ``gateways`` gateways on one store, and the store's own process."""

    def __init__(
        self,
        folder: Path,
        *,
        store: str,
        gateways: int,
        lease: float,
        ttl: float | None = None,
        gateway_src: Path | None = None,
    ) -> None:
        """``ttl``: the gateways' ``--ttl`` (``None``: their default).
        ``gateway_src``: run the gateways from that checkout's ``src`` (an older
        payonce, to see the checker find what it got wrong); the simulator and
        the checker stay this one."""
        if store not in STORES:
            raise ConfigError(f"--store: {store!r} is not one of {', '.join(STORES)}")
        if store == "memory" and gateways > 1:
            raise ConfigError("--store memory: one gateway only (the store is in its memory)")
        self.folder = folder
        self.kind = store
        python = [sys.executable, "-m", "payonce"]
        self.ledger = folder / "ledger.csv"
        sim_port = free_port()
        self.sim = Node(
            "sim",
            [*python, "sim", "--port", str(sim_port), "--latency", "fixed:0", "--token-rate",
             "inf", "--ledger", str(self.ledger), "--seed", "1"],
            sim_port,
            folder,
            "/_sim/health",
        )  # fmt: skip
        # The store's own processes: one redis-server, or Redis Cluster's three masters.
        self.redis_nodes: list[Node] = []
        self.postgres: LocalPostgres | None = None
        if store in ("redis", "redis-cluster"):
            server = shutil.which("redis-server")
            if server is None or (store == "redis-cluster" and not shutil.which("redis-cli")):
                raise ConfigError(f"--store {store}: redis-server and redis-cli must be on PATH")
            for number in range(3 if store == "redis-cluster" else 1):
                redis_port = _free_cluster_port() if store == "redis-cluster" else free_port()
                args = [server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", str(folder)]  # fmt: skip
                if store == "redis-cluster":
                    # A node stopped for seconds is not failed over (no replicas anyway).
                    args += ["--cluster-enabled", "yes", "--cluster-node-timeout", "15000",
                             "--cluster-config-file", f"nodes-{redis_port}.conf"]  # fmt: skip
                self.redis_nodes.append(Node(f"redis{number}", args, redis_port, folder, ""))
            first = self.redis_nodes[0].port
            if store == "redis":
                self.store_url = f"redis://127.0.0.1:{first}/0?timeout=0.5"
            else:
                self.store_url = f"redis+cluster://127.0.0.1:{first}?timeout=0.5"
        elif store == "postgres":
            # A server of the run's own (torture/postgres.py), created by start().
            self.postgres = LocalPostgres(free_port())
            self.store_url = self.postgres.url + "?timeout=0.5"
        elif store == "sqlite":
            self.store_url = f"sqlite:///{folder / 'payonce.db'}"
        else:
            self.store_url = "memory://"
        self.gateways: list[Node] = []
        env = None
        if gateway_src is not None:
            env = {**os.environ, "PYTHONPATH": str(gateway_src.resolve() / "src")}
        for number in range(gateways):
            port = free_port()
            self.gateways.append(
                Node(
                    f"gateway{number}",
                    [*python, "serve", "--upstream", self.sim.url, "--port",
                     str(port), "--store", self.store_url, "--lease", f"{lease:g}s",
                     "--call-log", str(folder / f"calls{number}.jsonl"), "--no-otel",
                     "--wait-timeout", "60s", "--upstream-timeout", "30s",
                     *(["--ttl", f"{ttl:g}s"] if ttl is not None else [])],
                    port,
                    folder,
                    "/_payonce/health",
                    env=env,
                )
            )  # fmt: skip

    def store_marks(self) -> tuple[str, ...]:
        """What names the store to someone who reads it: its address, or its file's name."""
        if self.store_url.startswith("sqlite:///"):
            return (Path(self.store_url.removeprefix("sqlite:///")).name,)
        if self.postgres is not None:
            return (f"127.0.0.1:{self.postgres.port}",)
        return tuple(f"127.0.0.1:{node.port}" for node in self.redis_nodes)

    def start(self) -> None:
        """Start the store's processes, the simulator, then the gateways."""
        for node in self.redis_nodes:
            self._start_redis(node)
        if self.postgres is not None:
            self.postgres.create()
        if self.kind == "redis-cluster":
            self._join_cluster()
        self.sim.start()
        for gateway in self.gateways:
            gateway.start()

    @staticmethod
    def _start_redis(node: Node) -> None:
        node.starts += 1
        with node.log.open("ab") as output:
            node.process = subprocess.Popen(node.args, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", node.port), timeout=1) as connection,
            ):
                connection.sendall(b"PING\r\n")
                if connection.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {node.port} did not answer (log: {node.log})")

    def _join_cluster(self) -> None:
        """Make the three masters one Redis Cluster, every slot covered, and wait for it."""
        cli = shutil.which("redis-cli") or "redis-cli"
        create = [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.redis_nodes)]
        create += ["--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        deadline = time.monotonic() + 30
        while not all(
            b"cluster_state:ok" in _redis_command(node.port, "CLUSTER", "INFO")
            for node in self.redis_nodes
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("Redis Cluster did not reach cluster_state:ok in 30 s")
            time.sleep(0.05)

    def hold_store(self, seconds: float, target: int = 0) -> subprocess.Popen[bytes] | None:
        """Hold the store still for ``seconds``: SQLite's write lock in another process,
        PostgreSQL's tables locked from psql, Redis stopped, or node ``target`` of Redis
        Cluster stopped. Returns the lock holder (SQLite, PostgreSQL), which ends by itself."""
        if self.postgres is not None:
            return self.postgres.hold(seconds)
        if self.kind == "sqlite":
            database = self.store_url.removeprefix("sqlite:///")
            script = (
                "import sqlite3, sys, time\n"
                "c = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)\n"
                "c.execute('BEGIN IMMEDIATE')\n"
                "time.sleep(float(sys.argv[2]))\n"
                "c.execute('COMMIT')\n"
            )
            return subprocess.Popen([sys.executable, "-c", script, database, str(seconds)])
        if self.redis_nodes:
            self.redis_nodes[target % len(self.redis_nodes)].signal(signal.SIGSTOP)
        return None

    def release_store(self) -> None:
        for node in self.redis_nodes:
            if node.stopped:
                node.signal(signal.SIGCONT)

    def fill_disk(self, target: int) -> None:
        """Gateway ``target``'s disk is full: no file it writes may grow past its call
        log's size now (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write fails with
        EFBIG as it would with ENOSPC). SQLite's files past that size fail too."""
        gateway = self.gateways[target]
        if gateway.process is None or gateway.process.poll() is not None:
            return
        call_log = self.folder / f"calls{target}.jsonl"
        size = call_log.stat().st_size if call_log.exists() else 0
        _, hard = resource.prlimit(gateway.process.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(gateway.process.pid, resource.RLIMIT_FSIZE, (size, hard))

    def free_disk(self, target: int) -> None:
        """Gateway ``target``'s disk has room again."""
        gateway = self.gateways[target]
        if gateway.process is None or gateway.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            _, hard = resource.prlimit(gateway.process.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(gateway.process.pid, resource.RLIMIT_FSIZE, (hard, hard))

    def stop(self) -> None:
        """Stop everything (gateways first, so they flush their call logs)."""
        for gateway in self.gateways:
            gateway.stop()
        self.sim.stop()
        for node in self.redis_nodes:
            node.stop()
        if self.postgres is not None:
            self.postgres.remove()
