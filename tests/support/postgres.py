"""PostgreSQL (and PgBouncer) for tests: our own server, in a temporary folder, on a free port.

Never the machine's own server: ``initdb`` into a fresh folder, ``postgres``
on a free 127.0.0.1 port with its socket in that folder, trust authentication
for one user, ``payonce``, and one database, ``payonce``. PostgreSQL refuses
to run as root, so under root (CI) the server runs as the ``postgres`` user
that Debian's package creates. The binaries come from Debian's ``postgresql``
package (``/usr/lib/postgresql/<major>/bin``), installed through the apt helper.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support import apt
from tests.support.processes import free_port

__all__ = ["PgBouncer", "Postgres", "bin_dir", "running_pgbouncer", "running_postgres"]

USER = DATABASE = "payonce"


def bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries (installing the package when missing)."""
    apt.installed(("pg_ctlcluster",), "postgresql", required=True)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major)
    if not found:
        raise RuntimeError("postgresql is installed but no /usr/lib/postgresql/*/bin/initdb")
    return Path(found[-1]).parent


def _major(path: str) -> int:
    return int(Path(path).parents[1].name)


def _as_owner() -> tuple[list[str], int | None]:
    """The command prefix that runs as the server's owner, and that owner's uid."""
    if os.geteuid() != 0:
        return [], None
    owner = pwd.getpwnam("postgres")
    return ["runuser", "-u", "postgres", "--"], owner.pw_uid


@dataclass
class Postgres:
    """A running server of our own."""

    folder: Path
    port: int
    popen: subprocess.Popen[bytes]
    bin: Path

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def log(self) -> Path:
        return self.folder / "postgres.log"

    def psql(self, sql: str, *, database: str = DATABASE, timeout: float = 60) -> str:
        """Run ``sql`` with psql as the superuser; its output (raises on an error)."""
        prefix, _ = _as_owner()
        done = subprocess.run(
            [
                *prefix,
                str(self.bin / "psql"),
                *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database),
                *("-v", "ON_ERROR_STOP=1", "-X", "-q", "-A", "-t", "-c", sql),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def psql_background(self, sql: str) -> subprocess.Popen[bytes]:
        """``sql`` in a psql of its own that keeps running (a lock held, a long statement)."""
        prefix, _ = _as_owner()
        return subprocess.Popen(
            [
                *prefix,
                str(self.bin / "psql"),
                *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", DATABASE),
                *("-v", "ON_ERROR_STOP=1", "-X", "-q", "-c", sql),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect everyone; ``immediate``: as a crash)."""
        prefix, _ = _as_owner()
        subprocess.run(
            [
                *prefix,
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.folder / "data"),
                "-m",
                mode,
                "stop",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=30)

    def start(self) -> None:
        """Start it again on the same port and data (after :meth:`stop`)."""
        self.popen = _start(self.bin, self.folder, self.port)


def _start(bin_: Path, folder: Path, port: int) -> subprocess.Popen[bytes]:
    prefix, _ = _as_owner()
    with (folder / "postgres.log").open("ab") as log:
        popen = subprocess.Popen(
            [
                *prefix,
                str(bin_ / "postgres"),
                *("-D", str(folder / "data"), "-p", str(port), "-k", str(folder)),
                *("-c", "listen_addresses=127.0.0.1"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            tail = (folder / "postgres.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"postgres exited with {popen.returncode}:\n{tail}")
        ready = subprocess.run(
            [str(bin_ / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"],
            capture_output=True,
            check=False,
        )
        if ready.returncode == 0:
            return popen
        time.sleep(0.1)
    popen.kill()
    raise RuntimeError(f"postgres did not accept connections on {port} within 60 s")


@contextlib.contextmanager
def running_postgres(settings: Sequence[str] = ()) -> Iterator[Postgres]:
    """A fresh server: user ``payonce`` owning database ``payonce``; removed afterwards.

    ``settings``: lines added to ``postgresql.conf`` (``"max_connections = 20"``).
    """
    bin_ = bin_dir()
    prefix, uid = _as_owner()
    # Not under pytest's tmp_path: its folders are root's alone (mode 700), and
    # the server may run as postgres.
    folder = Path(tempfile.mkdtemp(prefix="payonce-pg-"))
    if uid is not None:
        os.chown(folder, uid, -1)
    try:
        subprocess.run(
            [
                *prefix,
                str(bin_ / "initdb"),
                *("-D", str(folder / "data"), "-U", "postgres", "--auth=trust"),
                *("--no-sync", "-E", "UTF8", "--locale=C"),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
        # Small and fast (a test's data need not survive a power cut); the
        # caller's settings come after, so they win.
        lines = ["fsync = off", "max_connections = 60", "shared_buffers = 32MB", *settings]
        with (folder / "data" / "postgresql.conf").open("a") as handle:
            handle.write("\n".join(lines) + "\n")
        port = free_port()
        server = Postgres(folder, port, _start(bin_, folder, port), bin_)
        try:
            server.psql(f"CREATE USER {USER}", database="postgres")
            server.psql(f"CREATE DATABASE {DATABASE} OWNER {USER}", database="postgres")
            yield server
        finally:
            server.stop("immediate")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class PgBouncer:
    """A PgBouncer in transaction mode in front of a :class:`Postgres`."""

    port: int
    popen: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"


@contextlib.contextmanager
def running_pgbouncer(server: Postgres, *, prepared_statements: int = 0) -> Iterator[PgBouncer]:
    """PgBouncer (Debian's package) in ``pool_mode = transaction`` in front of ``server``.

    ``prepared_statements``: its ``max_prepared_statements`` (0: off, what
    PgBouncer before 1.21 always was).
    """
    program = apt.installed(("pgbouncer",), "pgbouncer", required=True)
    prefix, uid = _as_owner()
    folder = server.folder / "pgbouncer"
    folder.mkdir(exist_ok=True)
    port = free_port()
    (folder / "users.txt").write_text(f'"{USER}" ""\n')
    lines = [
        "[databases]",
        f"{DATABASE} = host=127.0.0.1 port={server.port} dbname={DATABASE}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        f"unix_socket_dir = {folder}",
        "auth_type = trust",
        f"auth_file = {folder / 'users.txt'}",
        "pool_mode = transaction",
        "default_pool_size = 10",
        f"logfile = {folder / 'pgbouncer.log'}",
        f"pidfile = {folder / 'pgbouncer.pid'}",
    ]
    if prepared_statements:
        lines.append(f"max_prepared_statements = {prepared_statements}")
    (folder / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
    if uid is not None:
        for path in (folder, *folder.iterdir()):
            os.chown(path, uid, -1)
    popen = subprocess.Popen(
        [*prefix, program, str(folder / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            if popen.poll() is not None or time.monotonic() > deadline:
                log = folder / "pgbouncer.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"pgbouncer did not start:\n{tail}")
            time.sleep(0.05)
        yield PgBouncer(port, popen)
    finally:
        popen.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=10)
