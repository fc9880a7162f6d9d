"""A PostgreSQL server of a torture run's own: ``initdb`` into a folder, a free port.

``payonce torture --store postgres`` starts one (never the machine's server,
never an operator's database) from the binaries of Debian's ``postgresql``
package (``/usr/lib/postgresql/<major>/bin``, or ``$PAYONCE_PG_BIN``), with
trust authentication on 127.0.0.1 for one user and one database, both
``payonce``. PostgreSQL refuses to run as root: as root the server runs as
the ``postgres`` user the package creates. The suite's tests start theirs
through the same code (tests/support/postgres.py).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from payonce.errors import ConfigError

__all__ = ["DATABASE", "USER", "LocalPostgres", "bin_dir", "owner"]

USER = DATABASE = "payonce"
_BIN_ENV = "PAYONCE_PG_BIN"


def bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries (``$PAYONCE_PG_BIN`` to choose)."""
    chosen = os.environ.get(_BIN_ENV)
    if chosen:
        return Path(chosen)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parents[1].name)
    )
    if not found:
        raise ConfigError(
            "--store postgres: no PostgreSQL binaries (apt-get install postgresql, or set"
            f" {_BIN_ENV} to the folder holding initdb and postgres)"
        )
    return Path(found[-1]).parent


def owner() -> tuple[list[str], int | None]:
    """The command prefix that runs as the server's owner, and that owner's uid."""
    if os.geteuid() != 0:
        return [], None
    return ["runuser", "-u", "postgres", "--"], pwd.getpwnam("postgres").pw_uid


class LocalPostgres:
    """One server in a folder of its own (removed by :meth:`remove`)."""

    def __init__(self, port: int, settings: tuple[str, ...] = ()) -> None:
        """``settings``: lines for ``postgresql.conf``, after payonce's small defaults."""
        self.bin = bin_dir()
        self.port = port
        self.settings = settings
        self.folder = Path(tempfile.mkdtemp(prefix="payonce-pg-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._prefix, uid = owner()
        if uid is not None:
            os.chown(self.folder, uid, -1)  # mkdtemp's folder is root's alone

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def log(self) -> Path:
        return self.folder / "postgres.log"

    def create(self) -> None:
        """``initdb``, the server started, user and database ``payonce`` created."""
        done = subprocess.run(
            [
                *self._prefix,
                str(self.bin / "initdb"),
                *("-D", str(self.folder / "data"), "-U", "postgres", "--auth=trust"),
                *("--no-sync", "-E", "UTF8", "--locale=C"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()[-2000:]}")
        # Small and fast (its data need not survive a power cut); the caller's
        # settings come after, so they win.
        lines = ["fsync = off", "max_connections = 60", "shared_buffers = 32MB", *self.settings]
        with (self.folder / "data" / "postgresql.conf").open("a") as handle:
            handle.write("\n".join(lines) + "\n")
        self.start()
        self.psql(f"CREATE USER {USER}", database="postgres")
        self.psql(f"CREATE DATABASE {DATABASE} OWNER {USER}", database="postgres")

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (again) on its port and data; return once it accepts."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *self._prefix,
                    str(self.bin / "postgres"),
                    *("-D", str(self.folder / "data"), "-p", str(self.port)),
                    *("-k", str(self.folder), "-c", "listen_addresses=127.0.0.1"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"postgres exited with {self.process.returncode}:\n{tail}")
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                capture_output=True,
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        self.process.kill()
        raise RuntimeError(f"postgres did not accept connections on {self.port} in {timeout:g} s")

    def _psql(self, sql: str, database: str, quiet: bool) -> list[str]:
        return [
            *self._prefix,
            str(self.bin / "psql"),
            *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database),
            *("-v", "ON_ERROR_STOP=1", "-X", "-q", *(["-A", "-t"] if quiet else []), "-c", sql),
        ]

    def psql(self, sql: str, *, database: str = DATABASE, timeout: float = 60) -> str:
        """Run ``sql`` with psql as the superuser; its output (raises on an error)."""
        done = subprocess.run(
            self._psql(sql, database, True),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def psql_background(self, sql: str) -> subprocess.Popen[bytes]:
        """``sql`` in a psql of its own that keeps running (a lock held, a long sleep)."""
        return subprocess.Popen(
            self._psql(sql, DATABASE, False),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def hold(self, seconds: float) -> subprocess.Popen[bytes]:
        """Every payonce table locked against reads and writes for ``seconds``."""
        return self.psql_background(
            "BEGIN; LOCK TABLE payonce_records, payonce_events IN ACCESS EXCLUSIVE MODE;"
            f" SELECT pg_sleep({seconds:.3f}); COMMIT;"
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect everyone; ``immediate``: as a crash)."""
        data = str(self.folder / "data")
        subprocess.run(
            [*self._prefix, str(self.bin / "pg_ctl"), "-D", data, "-m", mode, "stop"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)

    def remove(self) -> None:
        """Stop it as a crash would, and delete its folder."""
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)
