"""The DuckDB connection reconcile runs on, and the one place its errors are translated.

DuckDB is told how much memory it may use and where to spill, so a join larger
than memory runs out of core instead of failing. Errors while reading a file
become :class:`~payonce.errors.ConfigError` naming the file (bad input: exit 2);
running out of memory or disk becomes a :class:`~payonce.errors.PayonceError`
that says which flag to change.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb

from payonce.errors import ConfigError, PayonceError

__all__ = ["Engine", "EngineSettings", "ProgressSink", "sql_string"]


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


class ProgressSink(Protocol):
    """Shows the progress of long statements (the terminal's progress bar)."""

    def track(
        self, label: str, poll: Callable[[], float]
    ) -> contextlib.AbstractContextManager[None]:
        """While the context is open, ``poll()`` returns 0-100, or -1 when unknown."""
        ...


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Resource limits. ``memory_limit`` is DuckDB syntax (``2GiB``, ``500MB``)."""

    memory_limit: str = "3GiB"
    temp_directory: Path | None = None
    threads: int | None = None


class Engine:
    """A DuckDB connection with limits set, UTC time, and error translation."""

    def __init__(self, settings: EngineSettings, progress: ProgressSink | None = None) -> None:
        self.progress = progress
        config: dict[str, Any] = {"memory_limit": settings.memory_limit}
        if settings.threads:
            config["threads"] = settings.threads
        try:
            self.connection = duckdb.connect(":memory:", config=config)
        except duckdb.Error as exc:
            raise ConfigError(f"--memory-limit: {_first_line(exc)}") from exc
        if settings.temp_directory is not None:
            self.execute(f"SET temp_directory = {sql_string(str(settings.temp_directory))}")
        # Days are UTC days whatever the machine's zone is.
        self.execute("SET TimeZone = 'UTC'")
        # Order only matters while numbering the lines of a JSON file (see
        # ``ordered``); elsewhere it costs memory and time for nothing.
        self.execute("SET preserve_insertion_order = false")
        # DuckDB would draw its own bar on stdout; ours (if any) polls instead.
        self.execute(f"SET enable_progress_bar = {progress is not None}")
        self.execute("SET enable_progress_bar_print = false")
        self.execute("SET progress_bar_time = 0")

    def close(self) -> None:
        self.connection.close()

    def execute(self, sql: str, *, source: str | None = None, progress: str | None = None) -> None:
        """Run statements. ``source`` names the input file being read: its errors
        are bad input. ``progress`` labels the progress bar, if one is shown."""
        with self._translated(source), self._tracked(progress or source):
            self.connection.execute(sql)

    @contextlib.contextmanager
    def ordered(self) -> Iterator[None]:
        """Keep file order inside the block, so that ``row_number() OVER ()`` numbers lines."""
        self.execute("SET preserve_insertion_order = true")
        try:
            yield
        finally:
            self.execute("SET preserve_insertion_order = false")

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """All rows of a query."""
        with self._translated(None):
            return self.connection.execute(sql).fetchall()

    def dicts(self, sql: str) -> list[dict[str, Any]]:
        """All rows of a query, as dicts keyed by column name."""
        with self._translated(None):
            cursor = self.connection.execute(sql)
            names = [column[0] for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def scalar(self, sql: str) -> Any:
        """The first value of the first row (None when there is no row)."""
        rows = self.rows(sql)
        return rows[0][0] if rows else None

    @contextlib.contextmanager
    def _tracked(self, label: str | None) -> Iterator[None]:
        if self.progress is None or label is None:
            yield
            return
        with self.progress.track(label, self._poll):
            yield

    def _poll(self) -> float:
        try:
            return float(self.connection.query_progress())
        except duckdb.Error:
            return -1.0

    @contextlib.contextmanager
    def _translated(self, label: str | None) -> Iterator[None]:
        try:
            yield
        except duckdb.OutOfMemoryException as exc:
            raise PayonceError(
                f"out of memory ({_first_line(exc)}); raise --memory-limit or point"
                " --temp-dir at a disk with more room"
            ) from exc
        except duckdb.IOException as exc:
            where = f"{label}: " if label else ""
            raise PayonceError(f"{where}{_first_line(exc)}") from exc
        except duckdb.Error as exc:
            if label is None:
                raise
            raise ConfigError(f"{label}: cannot read: {_reason(exc)}") from exc


_CSV_LINE = re.compile(r"CSV Error on Line: (\d+)")


def _reason(exc: BaseException) -> str:
    # DuckDB reads JSON lines with its CSV reader too, so its first line says "CSV
    # Error" for either; the line number and the cause are what the user can act on.
    text = str(exc)
    line = _CSV_LINE.search(text)
    if line and "Invalid unicode" in text:
        return f"line {line.group(1)} is not valid UTF-8"
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
