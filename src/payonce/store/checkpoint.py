"""WAL checkpoints for the SQLite store, on a thread of their own, so the event loop never syncs.

In WAL mode with ``synchronous=NORMAL`` a commit writes the WAL and syncs
nothing. SQLite syncs the disk in two places only: a checkpoint (the WAL is
synced, its pages copied into the database file, the database file synced),
and the first commit after the WAL starts over from its beginning (the new
WAL header is synced before any frame may overwrite an old one, or an OS crash
could bring old pages back). By default both happen in whichever connection
commits at the wrong moment, which in the gateway is the event loop's: at 5,000
streams in flight strace saw those syncs take 3.3 ms at the median, 66 ms at
p99, 190 ms at worst, and on a busy disk a purge's checkpoints stopped every
request for 5.9 s (benchmarks/NOTEBOOK.md).

So the store's loop connection turns automatic checkpoints off
(``wal_autocheckpoint=0``) and this thread does both, with connections of its
own (sqlite3 lets go of the GIL while SQLite works, so the loop runs on). Each
``INTERVAL`` seconds, if anything was committed since the last round:

- a PASSIVE checkpoint, which waits for no reader or writer;
- if it copied the whole WAL and the WAL holds ``RESTART_FRAMES`` frames or
  more (or none at all), the WAL starts over, with this thread as the first
  writer. SQLite starts the WAL over in a writer whose snapshot began after
  the whole WAL was copied, and only if no reader holds a snapshot inside the
  WAL. A *pin*, a read transaction this thread keeps open (renewed before
  each checkpoint, a new one begun before the old one ends), is such a
  reader, so the loop's writers never start it over. This thread begins a
  snapshot, takes the write lock by writing one row (at once, or not at all
  if a loop writer committed since that snapshot: then not this round), lets
  the pin go and commits. The header's sync happens here, with the write lock
  held: the loop's writers meet a busy lock for that long and wait it out on
  a timer, never in the loop (:mod:`payonce.store.group_commit`). Hence the
  threshold: at 5,000 streams in flight (about 10,000 WAL frames a second)
  starting over after every checkpoint, 7 times a second, added 105 ms to the
  streams' time to first byte at p99 in two runs; about once a second, 28 and
  50 ms (benchmarks/NOTEBOOK.md).

Under writes that never pause, a checkpoint hardly ever copies the whole WAL
(a commit lands while it syncs). Once the WAL holds ``FORCE_FRAMES`` frames,
the round holds this process's writes (the store's group commit waits while
``hold`` is set), copies the rest, then starts the WAL over as above; the
writes wait for that checkpoint's syncs, once per ``FORCE_FRAMES`` pages
written. Another process's writer may still come first; the round tries again
later, and past ``CAP_FRAMES`` it lets the pin go in that attempt, so the WAL
starts over in whichever writer comes first, possibly a loop's (one small sync
there, rather than a file that grows without end).

With several processes on one file (``serve --workers``), one checkpointer per
database does this: they elect it with an exclusive ``flock`` on
``<database>-checkpointer`` (not on the database or its ``-shm``, whose
descriptors must never be closed by anyone but SQLite, since closing any of a
process's descriptors of a file drops its POSIX locks). The others wait for
the lock; a process that dies lets it go.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass

__all__ = [
    "CAP_FRAMES",
    "FORCE_FRAMES",
    "INTERVAL",
    "NICE",
    "RESTART_FRAMES",
    "CheckpointStats",
    "Checkpointer",
]

log = logging.getLogger("payonce.store")

INTERVAL = 0.25  # seconds between checkpoints while anything is being written
# WAL frames (4 KiB pages each) from which a round starts the WAL over when a
# checkpoint copied all of it (and when it is empty), from which it holds the
# process's writes to do so, and from which it lets the pin go for it.
RESTART_FRAMES = 8192  # 32 MiB
FORCE_FRAMES = 32768  # 128 MiB
CAP_FRAMES = 65536  # 256 MiB
# The WAL file is cut back to this size when it starts over (its frames are
# rewritten from the start, but the file keeps its largest size otherwise).
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
# How far below the process the checkpoint thread runs, in nice steps (Linux:
# per thread). A round takes 5-45 ms of wall time at 20,000 events a second, a
# third of it CPU with the GIL let go. On the loop's core (a gateway pinned to
# one) at equal priority the loop got half the core meanwhile, and its clients'
# events came 10-40 ms late in bursts (benchmarks/NOTEBOOK.md, "The checkpointer
# beside the loop"). 10 lower, the loop gets about nine tenths of a shared core;
# the rounds still get a tenth, three times the CPU they use, and all of an idle one.
NICE = 10
_BUSY_TIMEOUT = 5.0  # this thread's own waits for another connection's lock
_GATE_TIMEOUT = 1.0  # ...but a forced round gives up sooner: another process's writers are busy

# The row written to start the WAL over. It must change: SQLite writes no page
# for an update that leaves a row as it was (so ``SET value = value`` would not do).
_TOUCH = (
    "INSERT INTO payonce_meta VALUES ('wal_restarts', '1')"
    " ON CONFLICT (name) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
)


@dataclass
class CheckpointStats:
    """What the thread did, for tests and the curious (read without a lock: counters only)."""

    elected: bool = False  # this process holds the checkpointer lock
    checkpoints: int = 0  # PASSIVE checkpoints run
    restarts: int = 0  # times the WAL started over, by whichever writer (its header says)
    rows: int = 0  # rows this thread committed to start it over (SQLite decides if one does)
    forced: int = 0  # checkpoints run with this process's writes held
    wal_frames: int = 0  # frames in the WAL at the last checkpoint
    most_frames: int = 0  # ...and at most
    held: float = 0.0  # seconds this process's writes were held, in all
    errors: int = 0


class Checkpointer:
    """Checkpoints ``path``'s WAL from a daemon thread; :meth:`stop` ends it."""

    def __init__(
        self,
        path: str,
        *,
        interval: float = INTERVAL,
        restart: int = RESTART_FRAMES,
        force: int = FORCE_FRAMES,
        cap: int = CAP_FRAMES,
        hold: threading.Event | None = None,
    ) -> None:
        """``hold``: set while a forced round starts the WAL over; the store's
        writes wait while it is (:class:`payonce.store.group_commit.GroupCommit`).
        """
        self._path = path
        self._hold = hold
        self._interval = interval
        self._frames = {"restart": restart, "force": force, "cap": cap}
        self._stop = threading.Event()
        self.stats = CheckpointStats()
        self._lock: int | None = None
        self._cycle: _Cycle | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"payonce-checkpoint {path}", daemon=True
        )

    def start(self) -> None:
        """Elects this process if it can, and then, before returning, runs the first round.

        In the caller (before the store serves): a WAL that is empty, as after
        the last connection closed, has no frame yet, and the first commit to
        write one syncs its header. That commit must be this one, not a request's.
        """
        self._lock = _open_lock(self._path + "-checkpointer")
        if self._lock is None or _try_lock(self._lock):
            self._elected()
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ends the thread (after the checkpoint in progress, if one is)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        stats = self.stats
        if stats.checkpoints:
            log.info(
                "SQLite checkpointer for %s: %d checkpoints, %d restarts in %d rows (%d forced;"
                " writes held %.3f s in all), WAL at most %d frames",
                self._path, stats.checkpoints, stats.restarts, stats.rows, stats.forced,
                stats.held, stats.most_frames,
            )  # fmt: skip

    def _elected(self) -> None:
        self.stats.elected = True
        self._cycle = _Cycle(self._path, self.stats, self._hold, **self._frames)
        try:
            self._cycle.round()
        except sqlite3.Error as exc:  # the next round, on the thread, tries again
            self.stats.errors += 1
            log.warning("SQLite checkpoint failed: %s", exc)

    def _run(self) -> None:
        _lower_priority()
        try:
            while self._cycle is None:
                if self._stop.wait(self._interval):
                    return
                if self._lock is not None and _try_lock(self._lock):
                    self._elected()
            self._cycle.run(self._stop, self._interval)
        except Exception:  # the gateway serves on; the WAL just grows
            self.stats.errors += 1
            log.exception("SQLite checkpointer for %s stopped", self._path)
        finally:
            if self._cycle is not None:
                self._cycle.close()
            if self._lock is not None:
                os.close(self._lock)


def _lower_priority() -> None:
    """On Linux, this thread ``NICE`` steps below the process: there ``setpriority``
    of a thread id is that thread's alone. Elsewhere the id could name another
    process, so the thread runs as it is, as it does if refused."""
    if not sys.platform.startswith("linux"):
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + NICE)
        )
    except OSError as exc:
        log.debug("SQLite checkpointer: kept its priority (%s)", exc)


def _wal_salt(fd: int) -> int | None:
    """Salt-1 of the WAL's header, which SQLite adds one to each time the WAL starts over.

    None when the header is not there yet (https://www.sqlite.org/fileformat2.html#walformat).
    """
    header = os.pread(fd, 4, 16)
    return int.from_bytes(header, "big") if len(header) == 4 else None


def _open_lock(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        # Without the lock every process checkpoints: more syncs, still none in a loop.
        log.warning("SQLite checkpointer: cannot open %s (%s); not electing one", path, exc)
        return None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class _Cycle:
    """The thread's connections, and one round: a checkpoint, maybe a restart."""

    def __init__(
        self,
        path: str,
        stats: CheckpointStats,
        hold: threading.Event | None,
        *,
        restart: int,
        force: int,
        cap: int,
    ) -> None:
        """``restart``, ``force``, ``cap``: WAL frames, as for :class:`Checkpointer`."""
        self._path, self._hold = path, hold
        self._restart_at, self._force, self._cap = restart, force, cap
        self.stats = stats
        self._pins = (self._connect(path), self._connect(path))
        self._held: sqlite3.Connection | None = None  # the pin in a read transaction
        self._writer = self._connect(path)  # checkpoints, and the restarting write
        self._writer.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
        # Waits out a commit in progress in a forced round.
        self._gate = self._connect(path, timeout=_GATE_TIMEOUT)
        self._seen: int | None = None  # data_version at the last round
        # Opened once, read each round: the pins keep the WAL file in place.
        self._wal: int | None = None
        self._salt: int | None = None  # the WAL header's salt-1 when last read
        self._count_restarts()

    @staticmethod
    def _connect(path: str, timeout: float = _BUSY_TIMEOUT) -> sqlite3.Connection:
        # Made in the store's thread, used in the checkpointer's.
        return sqlite3.connect(path, isolation_level=None, timeout=timeout, check_same_thread=False)

    def run(self, stop: threading.Event, interval: float) -> None:
        while not stop.wait(interval):
            try:
                self.round()
            except sqlite3.Error as exc:
                self.stats.errors += 1
                log.warning("SQLite checkpoint failed: %s", exc)

    def close(self) -> None:
        self._count_restarts()
        if self._wal is not None:
            os.close(self._wal)
        self._release_pin()
        for conn in (*self._pins, self._writer, self._gate):
            conn.close()

    def round(self) -> None:
        # data_version changes when another connection commits: an idle store
        # costs no checkpoint, no write and no sync.
        version = int(self._writer.execute("PRAGMA data_version").fetchone()[0])
        if version == self._seen:
            return
        self._count_restarts()
        self._take_pin()  # at the newest snapshot: the checkpoint may copy all of it
        # Read after the pin began: a later round runs only for a commit the pin
        # does not see, so the WAL then holds frames not yet copied, and the
        # next pin is taken inside it (never at a fully copied WAL, which would
        # leave no pin for a moment).
        self._seen = int(self._writer.execute("PRAGMA data_version").fetchone()[0])
        done = self._checkpoint()
        if done is None:
            return
        frames, copied = done
        # Each restart holds the write lock for a sync: not after every checkpoint.
        due = frames == 0 or frames >= self._restart_at
        if copied == frames and due and self._restart():
            return
        if frames >= self._force:  # a writer came first, or the copy fell behind it
            self._forced(unpin=frames >= self._cap)
        # Its own writes leave data_version as it is: the next round runs only
        # if someone else committed.

    def _count_restarts(self) -> None:
        """Add the WAL's restarts since the last look, read from its header.

        Not counted as this thread's rows commit: SQLite starts the WAL over in
        such a row only when no other connection's reader is inside the WAL, and
        any writer (another process's too) may be the first to find it all copied
        and start it over. Each restart is a sync of the header, wherever it is.
        """
        try:
            if self._wal is None:
                self._wal = os.open(self._path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
            salt = _wal_salt(self._wal)
        except OSError:  # no WAL yet
            return
        if salt is not None and self._salt is not None:
            self.stats.restarts += (salt - self._salt) % 2**32
        self._salt = salt if salt is not None else self._salt

    def _checkpoint(self) -> tuple[int, int] | None:
        """(frames in the WAL, frames copied); None if another checkpoint ran or not in WAL mode."""
        busy, frames, copied = self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.stats.checkpoints += 1
        self.stats.wal_frames = frames
        self.stats.most_frames = max(self.stats.most_frames, frames)
        return None if busy or frames < 0 else (frames, copied)

    def _take_pin(self) -> None:
        """A new pin at the newest snapshot, begun before the old one ends (never none)."""
        pin = self._pins[1] if self._held is self._pins[0] else self._pins[0]
        pin.execute("BEGIN")
        pin.execute("SELECT 1 FROM payonce_meta LIMIT 1").fetchone()
        self._release_pin()
        self._held = pin

    def _release_pin(self) -> None:
        if self._held is not None:
            self._held.execute("COMMIT")
            self._held = None

    def _restart(self) -> bool:
        """Write one row as the first writer since the whole WAL was copied (False: not now)."""
        writer = self._writer
        writer.execute("BEGIN")
        try:
            # This snapshot starts after the copy: SQLite may start the WAL over
            # in this transaction's commit, and in no writer that began before.
            writer.execute("SELECT 1 FROM payonce_meta LIMIT 1").fetchone()
            # Takes the write lock, or fails at once (SQLITE_BUSY, no busy
            # handler inside a read transaction) if a loop writer holds it or
            # committed since the snapshot began: then not this round.
            writer.execute(_TOUCH)
        except sqlite3.OperationalError:
            writer.execute("ROLLBACK")
            return False
        self._release_pin()  # with the write lock held, so no loop writer comes between
        try:
            writer.execute("COMMIT")  # the new header, and its sync, are here
        finally:
            if writer.in_transaction:
                writer.execute("ROLLBACK")
            self._take_pin()  # the row just written is not yet copied: pinned inside the WAL
        self.stats.rows += 1
        return True

    def _forced(self, *, unpin: bool) -> None:
        """Hold this process's writes, copy the rest of the WAL and start it over."""
        if self._hold is not None:
            self._hold.set()
        held = time.monotonic()
        try:
            try:
                # A barrier: a batch of the loop's that began before the hold has committed.
                self._gate.execute("BEGIN IMMEDIATE")
                self._gate.execute("ROLLBACK")
            except sqlite3.OperationalError:  # another process writes without pause
                return
            self._take_pin()  # nothing more of this process's is written: the last snapshot
            self._checkpoint()
            self.stats.forced += 1
            if unpin:
                self._release_pin()  # whoever writes first starts the WAL over (module docstring)
            self._restart()
        finally:
            if self._hold is not None:
                self._hold.clear()
            self.stats.held += time.monotonic() - held
