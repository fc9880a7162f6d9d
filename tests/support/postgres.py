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
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from payonce.torture import postgres as local
from tests.support import apt
from tests.support.processes import free_port

__all__ = ["PgBouncer", "Postgres", "bin_dir", "running_pgbouncer", "running_postgres"]

USER, DATABASE = local.USER, local.DATABASE


def bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries (installing the package when missing)."""
    apt.installed(("pg_ctlcluster",), "postgresql", required=True)
    return local.bin_dir()


# The server itself is payonce torture's (src/payonce/torture/postgres.py).
Postgres = local.LocalPostgres


@contextlib.contextmanager
def running_postgres(settings: Sequence[str] = ()) -> Iterator[Postgres]:
    """A fresh server: user ``payonce`` owning database ``payonce``; removed afterwards.

    ``settings``: lines added to ``postgresql.conf`` (``"max_connections = 20"``).
    """
    bin_dir()
    server = Postgres(free_port(), tuple(settings))
    try:
        server.create()
        yield server
    finally:
        server.remove()


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
    prefix, uid = local.owner()
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
